// A thin client of once's protocol (/v1, docs/protocol.md): effects
// exactly once over queues that deliver at least once, with every rule
// applied by a once server. No runtime dependencies: fetch, AbortSignal
// and node:crypto.
//
// Time is measured with performance.now() from when a request was sent,
// as the protocol asks: the server counts its durations from when it
// received the request, so the client's count ends first.
import { randomBytes } from "node:crypto";
import { canonical, keyOf, type Payload } from "./keys.js";

export { canonical, keyOf, Refused, type Payload } from "./keys.js";

/** A problem the server answered (application/problem+json). */
export interface Problem {
  code: string;
  detail: string;
  status?: number;
  key?: string;
  attempt?: number;
  field?: string;
  reason?: string;
  retry_after_ms?: number;
  action_status?: string;
}

/** An answer of the server that is not a claim. */
export class OnceError extends Error {
  readonly code: string;
  readonly status: number;
  readonly problem: Problem;
  /** When to ask again, in milliseconds; 0 when there is no point. */
  readonly retryAfterMs: number;
  constructor(problem: Problem, status = 0) {
    super(problem.detail || problem.code || "once: error");
    this.code = problem.code;
    this.status = status;
    this.problem = problem;
    this.retryAfterMs = problem.retry_after_ms ?? 0;
    this.name = new.target.name;
  }
}
/** Another attempt holds the action: ask again after retryAfterMs. */
export class InFlight extends OnceError {}
/** The outcome is unknown, and recovery has not decided yet. */
export class OutcomeUnknown extends OnceError {}
/** A person decides whether the action happened. */
export class Review extends OnceError {}
/** A person must approve the action before it runs. */
export class AwaitingApproval extends OnceError {}
/** The attempt is over: stop the effect. */
export class Fenced extends OnceError {}
/** Another outcome of the attempt was recorded first. */
export class Conflict extends OnceError {}
/** The key was first claimed with another payload. */
export class FingerprintMismatch extends OnceError {}
/** The key this client computed is not the server's. */
export class KeyMismatch extends OnceError {}
/** The intent breaks a rule: problem.field and problem.reason say which. */
export class InvalidIntent extends OnceError {}
/** The server could not reach its database; nothing ran. */
export class StoreUnavailable extends OnceError {}
/** The outcome could not be recorded: send it again. */
export class NotRecorded extends OnceError {}
export class Unauthorized extends OnceError {}
export class Forbidden extends OnceError {}
export class BadRequest extends OnceError {}
export class NotFound extends OnceError {}
/** The server did not answer, after every try. */
export class Unreachable extends OnceError {}
/**
 * The claim's answer came after its lease was spent: the effect was not
 * started (another worker may be taking the claim over), and the claim
 * was given back. Deliver the job again.
 */
export class LeaseSpent extends OnceError {}

const byCode: Record<string, new (p: Problem, s: number) => OnceError> = {
  in_flight: InFlight,
  outcome_unknown: OutcomeUnknown,
  review: Review,
  awaiting_approval: AwaitingApproval,
  fenced: Fenced,
  conflict: Conflict,
  fingerprint_mismatch: FingerprintMismatch,
  key_mismatch: KeyMismatch,
  invalid_intent: InvalidIntent,
  store_unavailable: StoreUnavailable,
  not_recorded: NotRecorded,
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  bad_request: BadRequest,
  not_found: NotFound,
};

/** The action failed for good: every duplicate is told so. */
export class Failed extends Error {
  constructor(
    readonly key: string,
    readonly attempt: number,
    message: string,
    readonly rejectedBy = "",
    readonly reason = "",
  ) {
    super(message || `rejected by ${rejectedBy}: ${reason}`);
    this.name = "Failed";
  }
}
/** Thrown by an effect that did not happen and may be tried again. */
export class RetryLater extends Error {
  override name = "RetryLater";
}
/** Thrown by an effect that did not happen and never will. */
export class Permanent extends Error {
  override name = "Permanent";
}

/** What an effect is. */
export interface Intent {
  run: string;
  step: number;
  kind: string;
  target?: string;
  /** { json: value } or { raw: bytes }; none is no payload. */
  payload?: Payload;
  payloadInKey?: boolean;
}

/** [key, fingerprint] of an intent, computed here. */
export function keysOf(i: Intent): [string, string] {
  return keyOf(i.run, i.step, i.kind, i.target ?? "", i.payload, i.payloadInKey ?? false);
}

function wire(i: Intent): Record<string, unknown> {
  const w: Record<string, unknown> = { run: i.run, step: i.step, kind: i.kind, target: i.target ?? "", payload_in_key: i.payloadInKey ?? false };
  if (i.payload && "raw" in i.payload) w.payload_base64 = Buffer.from(i.payload.raw).toString("base64");
  else if (i.payload && "json" in i.payload) w.payload = new RawJSON(canonical(i.payload.json));
  return w;
}

/** JSON text sent as it is. */
class RawJSON {
  constructor(readonly text: string) {}
}

function encode(v: unknown): string {
  const raws: string[] = [];
  const text = JSON.stringify(v, (_k, x) => {
    if (x instanceof RawJSON) {
      raws.push(x.text);
      return `\u0000raw${raws.length - 1}\u0000`;
    }
    return x;
  });
  return raws.reduce((t, r, i) => t.replace(JSON.stringify(`\u0000raw${i}\u0000`), r), text);
}

/** A fresh write token: 128 random bits. */
export function writeToken(): string {
  return randomBytes(16).toString("hex");
}

const now = () => performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface ClaimAnswer {
  answer: "claimed" | "replayed" | "failed";
  key: string;
  fingerprint: string;
  attempt: number;
  token?: string;
  provider_key?: string;
  stop_after_ms?: number;
  heartbeat_every_ms?: number;
  max_execution_ms?: number;
  result?: unknown;
  message?: string;
  rejected_by?: string;
  reason?: string;
}

/**
 * A claimed attempt: the only way to renew or settle its claim. signal
 * aborts when the claim cannot be renewed in time, when it is fenced, or
 * when max_execution passes: the effect must stop then.
 */
export class Attempt {
  readonly key: string;
  readonly number: number;
  readonly token: string;
  readonly providerKey: string;
  readonly heartbeatEveryMs: number;
  private deadlineAt: number;
  private readonly hardAt: number | undefined;
  private readonly abort = new AbortController();
  private readonly stopTimer: { t?: ReturnType<typeof setTimeout> } = {};

  constructor(
    private readonly client: Client,
    a: ClaimAnswer,
    sent: number,
  ) {
    this.key = a.key;
    this.number = a.attempt;
    this.token = a.token ?? "";
    this.providerKey = a.provider_key ?? "";
    this.heartbeatEveryMs = a.heartbeat_every_ms ?? 0;
    this.deadlineAt = sent + (a.stop_after_ms ?? 0);
    this.hardAt = a.max_execution_ms ? sent + a.max_execution_ms : undefined;
    this.arm();
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** Milliseconds until the effect must have stopped. */
  timeLeftMs(): number {
    const d = this.hardAt !== undefined ? Math.min(this.deadlineAt, this.hardAt) : this.deadlineAt;
    return Math.max(0, d - now());
  }

  private arm() {
    clearTimeout(this.stopTimer.t);
    if (this.abort.signal.aborted) return;
    this.stopTimer.t = setTimeout(() => this.abort.abort(new Error("once: the claim could not be renewed in time")), this.timeLeftMs());
    this.stopTimer.t.unref?.();
  }

  private ref() {
    return { key: this.key, attempt: this.number, token: this.token };
  }

  /** Renew the claim. Throws Fenced when the attempt is over. */
  async heartbeat(): Promise<void> {
    const sent = now();
    try {
      const a = await this.client.call<{ stop_after_ms: number }>("POST", "/v1/heartbeat", this.ref(), Math.max(500, this.timeLeftMs()));
      this.deadlineAt = sent + a.stop_after_ms;
      this.arm();
    } catch (e) {
      if (e instanceof Fenced) this.abort.abort(e);
      throw e;
    }
  }

  /** Stop the stop timer: the effect is over. */
  done() {
    clearTimeout(this.stopTimer.t);
  }

  private async settle(outcome: string, fields: Record<string, unknown>): Promise<string> {
    this.done();
    const a = await this.client.call<{ status: string }>(
      "POST",
      "/v1/outcome",
      { ...this.ref(), write: writeToken(), outcome, ...fields },
      this.client.recordTimeoutMs,
    );
    return a.status;
  }

  /** Record success with result (a JSON value); returns the status. */
  succeed(result: unknown = null): Promise<string> {
    return this.settle("succeeded", { result: new RawJSON(canonical(result ?? null)) });
  }
  /** Record that the effect did not happen and never will. */
  fail(error: unknown): Promise<string> {
    return this.settle("permanent", { error: text(error) });
  }
  /** Record that the effect did not happen: the next claim runs it. */
  release(error: unknown): Promise<string> {
    return this.settle("retry_later", { error: text(error) });
  }
  /** Record that the effect may have happened; the kind's recovery decides. */
  unknown(error: unknown): Promise<string> {
    return this.settle("unknown", { error: text(error) });
  }
}

function text(e: unknown): string {
  const s = e instanceof Error ? e.message || e.name : String(e);
  return s.trim() === "" ? "error" : s;
}

export type ClaimResult = { claimed: Attempt } | { replayed: { key: string; attempt: number; result: unknown } };

export interface ClientOptions {
  /** Each request's own timeout. Default 30 s. */
  timeoutMs?: number;
  /** How long a request whose reply was lost is sent again. Default 10 s. */
  retryForMs?: number;
  /** How long an outcome is sent again. Default 30 s. */
  recordTimeoutMs?: number;
  /** Compute keys here and have the server check them. Default true. */
  checkKeys?: boolean;
}

/**
 * A client of one server: url is its root (http://127.0.0.1:7070), token
 * a worker's (or an operator's) bearer token. A request whose reply is
 * lost is sent again, the same: every write of the protocol answers the
 * same when sent again.
 */
export class Client {
  readonly url: string;
  readonly timeoutMs: number;
  readonly retryForMs: number;
  readonly recordTimeoutMs: number;
  readonly checkKeys: boolean;
  constructor(
    url: string,
    private readonly token: string,
    o: ClientOptions = {},
  ) {
    this.url = url.replace(/\/+$/, "");
    this.timeoutMs = o.timeoutMs ?? 30_000;
    this.retryForMs = o.retryForMs ?? 10_000;
    this.recordTimeoutMs = o.recordTimeoutMs ?? 30_000;
    this.checkKeys = o.checkKeys ?? true;
  }

  /** @internal Sends a request, again while the budget lasts when no answer comes. */
  async call<T>(method: string, path: string, body?: unknown, budgetMs = this.retryForMs, timeoutMs = this.timeoutMs): Promise<T> {
    const data = body === undefined ? undefined : encode(body);
    const end = now() + budgetMs;
    let wait = 50;
    for (;;) {
      let last: OnceError;
      try {
        const resp = await fetch(this.url + path, {
          method,
          body: data,
          headers: { Authorization: "Bearer " + this.token, ...(data ? { "Content-Type": "application/json" } : {}) },
          signal: AbortSignal.timeout(timeoutMs),
        });
        const raw = await resp.text();
        if (resp.ok) return JSON.parse(raw) as T;
        let p: Problem;
        try {
          p = JSON.parse(raw) as Problem;
        } catch {
          p = { code: "", detail: `HTTP ${resp.status}: ${raw.slice(0, 200)}` };
        }
        const E = byCode[p.code] ?? OnceError;
        last = new E(p, resp.status);
        if (resp.status !== 503) throw last;
      } catch (e) {
        if (e instanceof OnceError && e.status !== 503) throw e;
        last = e instanceof OnceError ? e : new Unreachable({ code: "unreachable", detail: `once: ${method} ${path}: ${text(e)}` });
      }
      if (now() + wait > end) throw last;
      await sleep(wait);
      wait = Math.min(wait * 2, 1000);
    }
  }

  /** The server's [key, fingerprint] of an intent, checked against this client's. */
  async keys(i: Intent): Promise<[string, string]> {
    const body: Record<string, unknown> = { intent: wire(i) };
    if (this.checkKeys) [body.key, body.fingerprint] = keysOf(i);
    const a = await this.call<{ key: string; fingerprint: string }>("POST", "/v1/keys", body);
    return [a.key, a.fingerprint];
  }

  /** Claim an intent: claimed (run it and settle it) or replayed; throws Failed or an OnceError. */
  async claim(i: Intent, o: { waitMs?: number } = {}): Promise<ClaimResult> {
    const body: Record<string, unknown> = { intent: wire(i), write: writeToken() };
    if (o.waitMs) body.wait_ms = o.waitMs;
    if (this.checkKeys) [body.key, body.fingerprint] = keysOf(i);
    const sent = now();
    // A request that waits must outlast its wait, or it is cut before the
    // server answers and sent again (waiting again).
    const wait = o.waitMs ?? 0;
    const a = await this.call<ClaimAnswer>("POST", "/v1/claim", body, this.retryForMs + wait, Math.max(this.timeoutMs, wait + 10_000));
    if (a.answer === "claimed") return { claimed: new Attempt(this, a, sent) };
    if (a.answer === "replayed") return { replayed: { key: a.key, attempt: a.attempt, result: a.result } };
    throw new Failed(a.key, a.attempt, a.message ?? "", a.rejected_by ?? "", a.reason ?? "");
  }

  /** The action as the server reads it. */
  get(key: string): Promise<Record<string, unknown>> {
    return this.call("GET", "/v1/actions/" + encodeURIComponent(key));
  }

  /**
   * Run fn once for the intent and return its result; a duplicate gets
   * the stored result without running fn. fn throws RetryLater or
   * Permanent; anything else leaves the outcome unknown, for the kind's
   * recovery. While fn runs the claim is renewed, and a.signal aborts when
   * it cannot be.
   */
  async do<T>(i: Intent, fn: (a: Attempt) => Promise<T>, o: { waitMs?: number } = {}): Promise<T> {
    const got = await this.claim(i, o);
    if ("replayed" in got) return got.replayed.result as T;
    const a = got.claimed;
    if (a.timeLeftMs() <= 0) {
      // The answer came after the lease was spent (a slow reply, a
      // pause): another worker may be taking the claim over, so the
      // effect does not start here; the claim is given back if still ours.
      a.done();
      await a.release(new RetryLater("the claim's answer came after its lease was spent; nothing was started")).catch(() => {});
      throw new LeaseSpent({
        code: "lease_spent",
        key: a.key,
        attempt: a.number,
        retry_after_ms: 1000,
        detail: `once: the claim of ${a.key} came back after its lease was spent; the effect was not started: deliver the job again`,
      });
    }
    // The heartbeat loop sleeps until its next beat or the effect's end,
    // whichever comes first.
    let stopBeating!: () => void;
    const ended = new Promise<void>((r) => (stopBeating = r));
    let beating = true;
    const beat = (async () => {
      while (beating) {
        let t: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([ended, new Promise((r) => (t = setTimeout(r, Math.max(50, Math.min(a.heartbeatEveryMs, a.timeLeftMs() / 2)))))]);
        clearTimeout(t);
        if (!beating || a.signal.aborted) return;
        try {
          await a.heartbeat();
        } catch (e) {
          if (e instanceof Fenced) return;
        }
      }
    })();
    const stop = async () => {
      beating = false;
      stopBeating();
      await beat;
    };
    let result: T;
    try {
      result = await fn(a);
    } catch (e) {
      await stop();
      if (e instanceof RetryLater) await a.release(e);
      else if (e instanceof Permanent) await a.fail(e);
      else await a.unknown(e);
      throw e;
    }
    await stop();
    await a.succeed(result);
    return result;
  }

  /** A run whose steps are numbered 0, 1, 2... in the order do is called. */
  run(id: string): Run {
    return new Run(this, id);
  }
}

/** The steps of one run, numbered in order. */
export class Run {
  private next = 0;
  constructor(
    private readonly client: Client,
    readonly id: string,
  ) {}
  do<T>(kind: string, fn: (a: Attempt) => Promise<T>, o: { target?: string; payload?: Payload; payloadInKey?: boolean; waitMs?: number } = {}): Promise<T> {
    const step = this.next++;
    return this.client.do({ run: this.id, step, kind, target: o.target, payload: o.payload, payloadInKey: o.payloadInKey }, fn, { waitMs: o.waitMs });
  }
}

/**
 * What a queue consumer does with a job whose do threw err: ack (nothing
 * is left to do), retry after afterMs, or drop (no delivery can change
 * it: a person or a new intent must).
 */
export function dispose(err: unknown): { action: "ack" | "retry" | "drop"; afterMs: number } {
  if (err === undefined || err === null || err instanceof Failed) return { action: "ack", afterMs: 0 };
  if (
    err instanceof InFlight ||
    err instanceof OutcomeUnknown ||
    err instanceof AwaitingApproval ||
    err instanceof StoreUnavailable ||
    err instanceof NotRecorded ||
    err instanceof Unreachable ||
    err instanceof LeaseSpent
  )
    return { action: "retry", afterMs: Math.max(err.retryAfterMs, 1000) };
  if (err instanceof RetryLater) return { action: "retry", afterMs: 1000 };
  if (
    err instanceof Review ||
    err instanceof FingerprintMismatch ||
    err instanceof InvalidIntent ||
    err instanceof KeyMismatch ||
    err instanceof Permanent ||
    err instanceof BadRequest ||
    err instanceof Fenced ||
    err instanceof Conflict
  )
    return { action: "drop", afterMs: 0 };
  return { action: "retry", afterMs: 5000 };
}
