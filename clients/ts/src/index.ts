// A thin client of once's protocol (/v1, docs/protocol.md): effects
// exactly once over queues that deliver at least once, with every rule
// applied by a once server. No runtime dependencies: fetch, AbortSignal
// and node:crypto.
//
// Time is measured with performance.now() from when a request was sent,
// as the protocol asks: the server counts its durations from when it
// received the request, so the client's count ends first.
import { randomBytes } from "node:crypto";
import { canonical, keyOf, NotJSON, type Payload } from "./keys.js";

export { canonical, keyOf, NotJSON, Refused, type Payload } from "./keys.js";

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
/**
 * The kind's policy is the server's (its kinds file), and the claim
 * carried another: drop the Policy, or make it the server's.
 */
export class PolicyPinned extends OnceError {}
/** The action waits for a verifier of its kind, which this server has not. */
export class NeedsVerifier extends OnceError {}
/**
 * A verifier asked for a kind the server's kinds file does not have
 * verified by clients ("verifier": "client").
 */
export class NotClientVerified extends OnceError {}
/**
 * A verifier's answer came after the question was given up on (its
 * answer_within passed): it counted as cannot tell.
 */
export class NoSuchQuestion extends OnceError {}
/** The request is larger than the server takes. */
export class TooLarge extends OnceError {}
/** The outcome's result is larger than the server keeps. */
export class ResultTooLarge extends OnceError {}

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
  policy_pinned: PolicyPinned,
  needs_verifier: NeedsVerifier,
  not_client_verified: NotClientVerified,
  no_such_question: NoSuchQuestion,
  too_large: TooLarge,
  result_too_large: ResultTooLarge,
};

/**
 * The effect returned a result that is not JSON (path and reason say
 * where and why). Its outcome was recorded unknown, for the kind's
 * recovery to decide: the effect may have happened, and its result
 * cannot be kept. status is what the server made of it.
 */
export class ResultNotJSON extends NotJSON {
  override name = "ResultNotJSON";
  constructor(
    err: NotJSON,
    readonly key: string,
    readonly attempt: number,
    readonly status: string,
  ) {
    super(err.path, err.reason);
  }
}

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

/**
 * A kind's policy as a claim carries it (the protocol's Policy, a Go
 * worker's Config): what the server applies to a kind it does not pin.
 * Durations are milliseconds; none (or 0, or "") is the server's default.
 * leaseMs is 1 s to 1 h, maxExecutionMs 1 s to 24 h; recovery is
 * "ask_person" or "retry_with_provider_key" (verify_then_decide is pinned
 * by the server's kinds file). A pinned kind refuses a claim carrying
 * another policy: PolicyPinned.
 */
export interface Policy {
  leaseMs?: number;
  maxExecutionMs?: number;
  retentionMs?: number;
  recovery?: "" | "ask_person" | "retry_with_provider_key";
}

/** A policy as the protocol sends it; undefined when it says nothing. */
export function policyWire(p: Policy | undefined): Record<string, unknown> | undefined {
  if (!p) return undefined;
  const w: Record<string, unknown> = {};
  if (p.leaseMs) w.lease_ms = Math.round(p.leaseMs);
  if (p.maxExecutionMs) w.max_execution_ms = Math.round(p.maxExecutionMs);
  if (p.retentionMs) w.retention_ms = Math.round(p.retentionMs);
  if (p.recovery) w.recovery = p.recovery;
  return Object.keys(w).length > 0 ? w : undefined;
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

/**
 * [key, fingerprint] of an intent, computed here. A payload that is not
 * JSON throws NotJSON, naming its path.
 */
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
  return raws.reduce((t, r, i) => t.replace(JSON.stringify(`\u0000raw${i}\u0000`), () => r), text);
}

/** A fresh write token: 128 random bits. */
export function writeToken(): string {
  return randomBytes(16).toString("hex");
}

const now = () => performance.now();

// Sleeps ms, or less when signal aborts.
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((r) => {
    if (signal?.aborted) return r();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      r();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

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
  /** The policy the claim carried, carried again by heartbeats and the outcome. */
  readonly policy: Policy | undefined;
  private deadlineAt: number;
  private readonly hardAt: number | undefined;
  private readonly abort = new AbortController();
  private stopTimer: ReturnType<typeof setTimeout> | undefined;
  private over = false;

  constructor(
    private readonly client: Client,
    a: ClaimAnswer,
    sent: number,
    policy?: Policy,
  ) {
    this.key = a.key;
    this.number = a.attempt;
    this.token = a.token ?? "";
    this.providerKey = a.provider_key ?? "";
    this.heartbeatEveryMs = a.heartbeat_every_ms ?? 0;
    this.policy = policy;
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
    clearTimeout(this.stopTimer);
    if (this.over || this.abort.signal.aborted) return;
    this.stopTimer = setTimeout(() => this.abort.abort(new Error("once: the claim could not be renewed in time")), this.timeLeftMs());
    this.stopTimer.unref?.();
  }

  private ref(): Record<string, unknown> {
    const r: Record<string, unknown> = { key: this.key, attempt: this.number, token: this.token };
    const p = policyWire(this.policy);
    if (p) r.policy = p; // a heartbeat renews the lease it says
    return r;
  }

  /**
   * Renew the claim. Throws Fenced when the attempt is over. The request
   * is bounded by the lease, each try included: a heartbeat that hangs
   * past it renews nothing the effect could use.
   */
  async heartbeat(): Promise<void> {
    const sent = now();
    const left = Math.max(500, this.timeLeftMs());
    try {
      const a = await this.client.call<{ stop_after_ms: number }>("POST", "/v1/heartbeat", this.ref(), left, Math.min(left, this.client.timeoutMs));
      this.deadlineAt = sent + a.stop_after_ms;
      this.arm();
    } catch (e) {
      if (e instanceof Fenced) this.abort.abort(e);
      throw e;
    }
  }

  /** Stop the stop timer: the effect is over. */
  done() {
    this.over = true;
    clearTimeout(this.stopTimer);
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

  /** @internal Record success with result already JSON text. */
  succeedText(result: string): Promise<string> {
    return this.settle("succeeded", { result: new RawJSON(result) });
  }

  /**
   * Record success with result (a JSON value); returns the status. A
   * result that is not JSON rejects with NotJSON, naming its path, before
   * anything is sent: the attempt is still held.
   */
  async succeed(result: unknown = null): Promise<string> {
    return this.succeedText(canonical(result ?? null, "result"));
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

// What the server keeps of an error's text: 16 KiB of UTF-8.
const maxErrorBytes = 16 << 10;

/** e as an outcome's or a verdict's error: its text, or its name, cut to what the server keeps. */
function text(e: unknown): string {
  let s = (e instanceof Error ? e.message || e.name : String(e)).trim();
  if (s === "") s = e instanceof Error ? e.name || "error" : "error";
  const b = Buffer.from(s, "utf8");
  if (b.length <= maxErrorBytes) return s;
  // Cut on a character's boundary: a UTF-8 continuation byte is 10xxxxxx.
  let n = maxErrorBytes - 3;
  while (n > 0 && (b[n] & 0xc0) === 0x80) n--;
  return b.subarray(0, n).toString("utf8") + "...";
}

export type ClaimResult = { claimed: Attempt } | { replayed: { key: string; attempt: number; result: unknown } };

/** How a claim is made: waitMs is how long the server holds it while another attempt is in flight. */
export interface ClaimOptions {
  waitMs?: number;
  /** Carried instead of the client's policy for the kind. */
  policy?: Policy;
}

export interface ClientOptions {
  /** Each request's own timeout. Default 30 s. */
  timeoutMs?: number;
  /** How long a request whose reply was lost is sent again. Default 10 s. */
  retryForMs?: number;
  /** How long an outcome is sent again. Default 30 s. */
  recordTimeoutMs?: number;
  /** Compute keys here and have the server check them. Default true. */
  checkKeys?: boolean;
  /** The policy each kind's claims carry (a Go worker's Config.Kinds). */
  policies?: Record<string, Policy>;
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
  readonly policies: Readonly<Record<string, Policy>>;
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
    this.policies = { ...(o.policies ?? {}) };
  }

  /**
   * @internal Sends a request, again while the budget lasts when no
   * answer comes. signal, when it aborts, ends the tries: the request in
   * flight is cut, and Unreachable thrown.
   */
  async call<T>(method: string, path: string, body?: unknown, budgetMs = this.retryForMs, timeoutMs = this.timeoutMs, signal?: AbortSignal): Promise<T> {
    const data = body === undefined ? undefined : encode(body);
    const end = now() + budgetMs;
    let wait = 50;
    for (;;) {
      let last: OnceError;
      try {
        const cut = AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs)));
        const resp = await fetch(this.url + path, {
          method,
          body: data,
          headers: { Authorization: "Bearer " + this.token, ...(data ? { "Content-Type": "application/json" } : {}) },
          signal: signal ? AbortSignal.any([cut, signal]) : cut,
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
      if (signal?.aborted || now() + wait > end) throw last;
      await sleep(Math.min(wait, Math.max(0, end - now())), signal);
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

  /**
   * Claim an intent: claimed (run it and settle it) or replayed; throws
   * Failed or an OnceError. o.policy (or the client's for the kind) is
   * carried: PolicyPinned when the server pins the kind otherwise. A
   * payload that is not JSON rejects with NotJSON, naming its path,
   * before any request.
   */
  async claim(i: Intent, o: ClaimOptions = {}): Promise<ClaimResult> {
    const body: Record<string, unknown> = { intent: wire(i), write: writeToken() };
    if (o.waitMs) body.wait_ms = o.waitMs;
    if (this.checkKeys) [body.key, body.fingerprint] = keysOf(i);
    const policy = o.policy ?? this.policies[i.kind];
    const pw = policyWire(policy);
    if (pw) body.policy = pw;
    const sent = now();
    // A request that waits must outlast its wait, or it is cut before the
    // server answers and sent again (waiting again).
    const wait = o.waitMs ?? 0;
    const a = await this.call<ClaimAnswer>("POST", "/v1/claim", body, this.retryForMs + wait, Math.max(this.timeoutMs, wait + 10_000));
    if (a.answer === "claimed") return { claimed: new Attempt(this, a, sent, pw ? policy : undefined) };
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
   * it cannot be. The outcome is sent as soon as fn ends, whatever a
   * heartbeat is doing.
   *
   * A result that is not JSON (a bigint, a Map, a cycle...) is recorded as
   * outcome unknown, with an error naming its path, and rejects with
   * ResultNotJSON: the effect may have happened, and its result cannot be
   * kept.
   */
  async do<T>(i: Intent, fn: (a: Attempt) => Promise<T>, o: ClaimOptions = {}): Promise<T> {
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
    // whichever comes first. The outcome does not wait for it: a
    // heartbeat stuck on the network would hold the outcome back past
    // the lease, and another worker would take the claim over.
    const ended = new AbortController();
    void (async () => {
      while (!ended.signal.aborted) {
        await sleep(Math.max(50, Math.min(a.heartbeatEveryMs, a.timeLeftMs() / 2)), ended.signal);
        if (ended.signal.aborted || a.signal.aborted) return;
        try {
          await a.heartbeat();
        } catch (e) {
          if (e instanceof Fenced) return;
          // Tried again at the next beat; the time left runs out meanwhile.
        }
      }
    })();
    let result: T;
    try {
      result = await fn(a);
    } catch (e) {
      ended.abort();
      if (e instanceof RetryLater) await a.release(e);
      else if (e instanceof Permanent) await a.fail(e);
      else await a.unknown(e);
      throw e;
    }
    ended.abort();
    let json: string;
    try {
      json = canonical(result ?? null, "result");
    } catch (e) {
      if (!(e instanceof NotJSON)) throw e;
      const status = await a.unknown(e);
      throw new ResultNotJSON(e, a.key, a.number, status);
    }
    await a.succeedText(json);
    return result;
  }

  /** A run whose steps are numbered 0, 1, 2... in the order do is called. */
  run(id: string): Run {
    return new Run(this, id);
  }

  /** A Verifier of kinds that answers with fn (see Verifier). */
  verifier(kinds: string | string[], fn: VerifyFn, o: VerifierOptions = {}): Verifier {
    return new Verifier(this, kinds, fn, o);
  }

  /** Answer the questions of kinds with fn until o.signal aborts: Verifier.run. */
  verify(kinds: string | string[], fn: VerifyFn, o: VerifierOptions & { signal: AbortSignal }): Promise<void> {
    return this.verifier(kinds, fn, o).run(o.signal);
  }

  /**
   * Take at most one batch of questions of kinds, waiting up to o.waitMs
   * for the first, answer them with fn, and return how many answers the
   * server received: Verifier.verifyOnce.
   */
  verifyOnce(kinds: string | string[], fn: VerifyFn, o: VerifierOptions = {}): Promise<number> {
    return this.verifier(kinds, fn, o).verifyOnce();
  }
}

/** The steps of one run, numbered in order. */
export class Run {
  private next = 0;
  constructor(
    private readonly client: Client,
    readonly id: string,
  ) {}
  do<T>(kind: string, fn: (a: Attempt) => Promise<T>, o: { target?: string; payload?: Payload; payloadInKey?: boolean } & ClaimOptions = {}): Promise<T> {
    const step = this.next++;
    return this.client.do({ run: this.id, step, kind, target: o.target, payload: o.payload, payloadInKey: o.payloadInKey }, fn, { waitMs: o.waitMs, policy: o.policy });
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
    err instanceof LeaseSpent ||
    err instanceof NeedsVerifier
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
    err instanceof Conflict ||
    err instanceof PolicyPinned ||
    err instanceof NotJSON
  )
    return { action: "drop", afterMs: 0 };
  return { action: "retry", afterMs: 5000 };
}

// --- verifying from a client ----------------------------------------------

/**
 * A question a verifier answers: did attempt's effect land at the
 * provider? Ask the provider by providerKey. payload is the intent's JSON
 * payload (undefined when it had none), raw its bytes when not JSON; note
 * what the effect noted, or why its outcome is unknown.
 */
export class Question {
  readonly id: string;
  readonly key: string;
  readonly attempt: number;
  readonly kind: string;
  readonly run: string;
  readonly step: number;
  readonly target: string;
  readonly providerKey: string;
  readonly payload: unknown;
  readonly raw: Uint8Array | undefined;
  readonly note: string;
  /** Milliseconds from the take's sending an answer is taken; 0: no end. */
  readonly answerWithinMs: number;
  private readonly deadlineAt: number | undefined;

  /** @internal */
  constructor(q: Record<string, unknown>, sent: number) {
    const s = (k: string) => (typeof q[k] === "string" ? (q[k] as string) : "");
    const n = (k: string) => (typeof q[k] === "number" ? (q[k] as number) : 0);
    this.id = s("question");
    this.key = s("key");
    this.attempt = n("attempt");
    this.kind = s("kind");
    this.run = s("run");
    this.step = n("step");
    this.target = s("target");
    this.providerKey = s("provider_key");
    this.payload = q.payload;
    this.raw = s("payload_base64") ? Buffer.from(s("payload_base64"), "base64") : undefined;
    this.note = s("note");
    this.answerWithinMs = n("answer_within_ms");
    this.deadlineAt = this.answerWithinMs ? sent + this.answerWithinMs : undefined;
  }

  /** How long an answer is still taken; undefined when it has no end. */
  timeLeftMs(): number | undefined {
    return this.deadlineAt === undefined ? undefined : Math.max(0, this.deadlineAt - now());
  }
}

/** A verifier's answer: landed(result), notLanded() or cannotTell(error). */
export type Verdict = { verdict: "landed"; result: unknown } | { verdict: "not_landed" } | { verdict: "cannot_tell"; error: string };

/** The effect landed: result is what the provider shows of it (a JSON value), kept as the action's result. */
export const landed = (result: unknown = null): Verdict => ({ verdict: "landed", result });
/** The effect did not land: the action is run again. */
export const notLanded = (): Verdict => ({ verdict: "not_landed" });
/** The provider could not say: asked again later, then review. */
export const cannotTell = (error: unknown): Verdict => ({ verdict: "cannot_tell", error: text(error) });

export type VerifyFn = (q: Question) => Verdict | Promise<Verdict>;

export interface VerifierOptions {
  /** How long a take waits for its first question. Default 20 s. */
  waitMs?: number;
  /** How many questions a take takes at most (1 to 100). Default 10. */
  max?: number;
  /** Where what the verifier lets pass is told (an answer not received, the server away). Default console.warn. */
  log?: (message: string) => void;
}

/**
 * A client verifier of kinds (docs/protocol.md, Verifying from a client):
 * it long-polls POST /v1/verify/take for their questions, asks fn(question)
 * whether each effect landed, and answers POST /v1/verify/answer.
 *
 * fn returns landed(result), notLanded() or cannotTell(error). An error
 * fn throws, a result that is not JSON, or a return that is none of the
 * three is answered cannot_tell with its text (bounded), so the action is
 * asked again later, never decided blind. An answer whose reply is lost
 * is sent again, the same (the same question id). An answer that came
 * too late (NoSuchQuestion) is logged and not counted.
 */
export class Verifier {
  readonly kinds: string[];
  readonly waitMs: number;
  readonly max: number;
  private readonly log: (message: string) => void;
  constructor(
    private readonly client: Client,
    kinds: string | string[],
    private readonly fn: VerifyFn,
    o: VerifierOptions = {},
  ) {
    this.kinds = typeof kinds === "string" ? [kinds] : [...kinds];
    this.waitMs = o.waitMs ?? 20_000;
    this.max = o.max ?? 10;
    this.log = o.log ?? ((m) => console.warn(m));
  }

  /** fn's verdict on q, as the body of its answer. */
  async verdict(q: Question): Promise<Record<string, unknown>> {
    let v: unknown;
    try {
      v = await this.fn(q);
    } catch (e) {
      v = cannotTell(`the verifier threw ${e instanceof Error ? e.name : typeof e}: ${text(e)}`);
    }
    const body: Record<string, unknown> = { question: q.id };
    const verdict = typeof v === "object" && v !== null ? (v as { verdict?: unknown }).verdict : undefined;
    if (verdict === "landed") {
      try {
        body.verdict = "landed";
        body.result = new RawJSON(canonical((v as { result?: unknown }).result ?? null, "result"));
        return body;
      } catch (e) {
        if (!(e instanceof NotJSON)) throw e;
        return { question: q.id, verdict: "cannot_tell", error: text(`the verifier's result is not JSON: ${e.message}`) };
      }
    }
    if (verdict === "not_landed") return { question: q.id, verdict: "not_landed" };
    if (verdict === "cannot_tell") return { question: q.id, verdict: "cannot_tell", error: text((v as { error?: unknown }).error || "cannot tell") };
    let shown: string;
    try {
      shown = JSON.stringify(v) ?? String(v);
    } catch {
      shown = String(v);
    }
    return { question: q.id, verdict: "cannot_tell", error: text(`the verifier returned ${shown}, not landed(), notLanded() or cannotTell()`) };
  }

  /**
   * Take one batch (waiting up to waitMs for its first question), answer
   * each, and return how many answers were received.
   */
  async verifyOnce(): Promise<number> {
    const sent = now();
    const got = await this.client.call<{ questions?: Record<string, unknown>[] }>(
      "POST",
      "/v1/verify/take",
      { kinds: this.kinds, wait_ms: Math.round(this.waitMs), max: this.max },
      this.client.retryForMs + this.waitMs,
      Math.max(this.client.timeoutMs, this.waitMs + 10_000),
    );
    let answered = 0;
    for (const raw of got.questions ?? []) {
      const q = new Question(raw, sent);
      if (q.timeLeftMs() === 0) {
        this.log(`once: question ${q.id} about attempt ${q.attempt} of ${q.key} came too late to answer`);
        continue;
      }
      const answer = await this.verdict(q);
      try {
        // Sent again on a lost reply: the same question id, the same
        // verdict, answered received again.
        await this.client.call("POST", "/v1/verify/answer", answer, Math.max(q.timeLeftMs() ?? 0, this.client.retryForMs));
      } catch (e) {
        // Too late (it counted as cannot tell), or lost: the action is
        // asked about again; the rest are answered.
        if (e instanceof NoSuchQuestion || e instanceof Conflict || e instanceof Unreachable || e instanceof StoreUnavailable) {
          this.log(`once: the answer to question ${q.id} about attempt ${q.attempt} of ${q.key} was not received: ${e.message}`);
          continue;
        }
        throw e;
      }
      answered++;
    }
    return answered;
  }

  /**
   * Answer questions until signal aborts: it ends after the take in
   * progress, within waitMs, once the questions taken are answered. The
   * server not answering is waited out; an error that asking again cannot
   * change (Unauthorized, NotClientVerified, BadRequest...) rejects.
   */
  async run(signal: AbortSignal): Promise<void> {
    let backoff = 100;
    while (!signal.aborted) {
      try {
        await this.verifyOnce();
        backoff = 100;
      } catch (e) {
        if (!(e instanceof Unreachable || e instanceof StoreUnavailable || e instanceof NotRecorded)) throw e;
        this.log(`once: verifier of ${this.kinds.join(",")}: ${e.message}`);
        await sleep(backoff, signal);
        backoff = Math.min(backoff * 2, 5000);
      }
    }
  }
}
