// An agent run of five tool calls whose every effect happens once,
// however often the run is killed and resumed.
//
// A scripted model (no network, no weights: a fixed plan) drives an
// OpenAI-style tool loop: each turn it answers with one tool call, under
// a tool-call id it makes up afresh every turn, as a real model does. The
// loop runs each call through once's protocol, keyed by the run's id and
// the call's step number in the run (the client's Run), never by that id:
//
//	step 0  send_email   ada@example.com        the order was received
//	step 1  send_email   warehouse@example.com  reserve the stock
//	step 2  send_email   ada@example.com        the card is charged next
//	step 3  charge_card  the customer           42.00 EUR at the provider
//	step 4  send_email   ada@example.com        the receipt, with step 3's charge id
//
// The emails go to an SMTP server over a plain socket (a few lines of
// SMTP, no dependency); each carries a Message-ID made from its action's
// key, so every attempt of a step sends the same one. The charge goes to
// a payment provider over HTTP with the attempt's providerKey as its
// Idempotency-Key. The server's kinds file (kinds.json) says what a killed
// step becomes: send_email is verify_then_decide, and this process is its
// verifier (it searches the mail provider for the Message-ID);
// charge_card is retry_with_provider_key.
//
// Usage (ONCE_URL and ONCE_TOKEN name the once server and a worker token):
//
//	node dist/examples/agent-ts/src/agent.js --run order-42 --customer cus_1 \
//	    [--smtp 127.0.0.1:2525] [--provider http://127.0.0.1:8025] \
//	    [--mailbox http://127.0.0.1:8026] [--key-by step|tool-call-id]
//
// KILL_AT=STEP:PHASE makes the process SIGKILL itself at that point, for
// the tests and for trying it by hand: PHASE is before (the step boundary;
// step 5 is after the last call), claimed, mid (half of the message or
// the request sent), sent (all of it sent, the reply not read) or replied
// (the reply read, the outcome not recorded).
//
// Exit status: 0 the run finished; 3 a step waits for a person; 75 a step
// is held or undecided for now: run it again; 2 bad usage; 1 any other
// error.
import { randomBytes } from "node:crypto";
import { writeSync } from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import { parseArgs } from "node:util";

// In your project: from "@oncehq/client". Here the client is compiled
// from this repository's source, so the example runs it as it is.
import { type Attempt, Client, dispose, type Intent, keysOf, OnceError, Permanent, RetryLater, Review, type Run } from "../../../clients/ts/src/index.js";

// The order the run takes. A real agent has it from its conversation;
// what matters is that a resumed run sees the same one.
const order = {
  customerEmail: "ada@example.com",
  warehouse: "warehouse@example.com",
  item: "2 x enamel mug",
  amount: 4200,
  currency: "eur",
  sender: "shop@example.com",
};

// How long a step's claim waits for another attempt of it: a killed run's
// claim holds until its lease (kinds.json) runs out, then recovery decides.
const claimWaitMs = 30_000;

const phases = ["before", "claimed", "mid", "sent", "replied"] as const;

/** Writes a line at once: a process about to SIGKILL itself must not leave it in a buffer. */
function say(line: string) {
  writeSync(1, line + "\n");
}

// --- the model ------------------------------------------------------------------

interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}
type Message =
  | { role: "system" | "user"; content: string }
  | { role: "assistant"; content: string | null; tool_calls?: ToolCall[] }
  | { role: "tool"; tool_call_id: string; content: string };

type Args = Record<string, string | number>;

/**
 * Stands in for the LLM: given the conversation so far, the next
 * assistant message, in the chat-completions shape. Its plan is fixed,
 * and it reads earlier tool results (the charge's id) from the
 * conversation, as a model does. Its tool-call ids are random, new on
 * every turn: a resumed run sees other ids for the same calls.
 */
class ScriptedModel {
  constructor(
    private readonly runId: string,
    private readonly customer: string,
  ) {}

  respond(messages: Message[]): Message {
    const results = messages.flatMap((m) => (m.role === "tool" ? [JSON.parse(m.content) as Record<string, unknown>] : []));
    const calls = this.plan(results);
    if (results.length === calls.length) {
      return { role: "assistant", content: `Order ${this.runId} is paid and confirmed; the customer has a receipt.` };
    }
    const [name, args] = calls[results.length];
    return {
      role: "assistant",
      content: null,
      tool_calls: [{ id: "call_" + randomBytes(6).toString("hex"), type: "function", function: { name, arguments: JSON.stringify(args) } }],
    };
  }

  private plan(results: Record<string, unknown>[]): [string, Args][] {
    const r = this.runId;
    const money = `${Math.floor(order.amount / 100)}.${String(order.amount % 100).padStart(2, "0")} ${order.currency.toUpperCase()}`;
    const charge = results.length > 3 ? String(results[3].id) : null;
    const mail = (to: string, subject: string, body: string): [string, Args] => ["send_email", { from: order.sender, to, subject, body }];
    return [
      mail(order.customerEmail, `Order ${r}: received`, `We received your order ${r}: ${order.item}, ${money}.\n`),
      mail(order.warehouse, `Order ${r}: reserve stock`, `Reserve ${order.item} for order ${r}.\n`),
      mail(order.customerEmail, `Order ${r}: your card is charged next`, `Your ${order.item} are reserved; we charge ${money} to your card now.\n`),
      ["charge_card", { customer: this.customer, amount: order.amount, currency: order.currency, description: "order " + r }],
      mail(order.customerEmail, `Order ${r}: receipt`, `We charged ${money} (charge ${charge}). Thank you.\n`),
    ];
  }
}

// --- the agent ------------------------------------------------------------------

interface Options {
  run: string;
  customer: string;
  smtp: string;
  provider: string;
  mailbox: string;
  keyBy: "step" | "tool-call-id";
}

class Agent {
  private readonly run: Run;
  /** The tool calls made so far: the next call's step number. */
  step = 0;
  private readonly killAt: string | undefined;

  constructor(
    private readonly opts: Options,
    private readonly client: Client,
  ) {
    this.run = client.run(opts.run);
    const k = process.env.KILL_AT;
    if (k) {
      const [s, phase] = k.split(":");
      if (!/^\d+$/.test(s) || !(phases as readonly string[]).includes(phase)) {
        throw new Usage(`KILL_AT=${JSON.stringify(k)}; give STEP:PHASE, PHASE one of ${phases.join(", ")}`);
      }
      this.killAt = `${Number(s)}:${phase}`;
    }
  }

  /** SIGKILLs this process if KILL_AT names this point: a real kill, with no chance to record anything. */
  dieAt(step: number, phase: (typeof phases)[number]) {
    if (this.killAt === `${step}:${phase}`) {
      say(`kill: ${step}:${phase} (SIGKILL)`);
      process.kill(process.pid, "SIGKILL");
    }
  }

  /** The tool loop: ask the model, run the tool calls it answers with, hand their results back, until it answers without one. */
  async loop(model: ScriptedModel): Promise<string> {
    const messages: Message[] = [
      { role: "system", content: "You take orders: email the customer and the warehouse, charge the card." },
      { role: "user", content: `Take order ${this.opts.run} for customer ${this.opts.customer}.` },
    ];
    for (;;) {
      const reply = model.respond(messages);
      messages.push(reply);
      if (reply.role !== "assistant" || !reply.tool_calls?.length) {
        this.dieAt(this.step, "before");
        return reply.content ?? "";
      }
      for (const call of reply.tool_calls) {
        const result = await this.tool(call);
        messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(result) });
      }
    }
  }

  /**
   * Runs one tool call once. Its key is the run and the step, with the
   * kind and the target: the arguments are its fingerprint, so a resumed
   * run that asks for something else at this step is refused, not run.
   * The tool-call id is only printed.
   */
  async tool(call: ToolCall): Promise<unknown> {
    const name = call.function.name;
    const args = JSON.parse(call.function.arguments) as Args;
    const step = this.step++;
    this.dieAt(step, "before");
    const [effect, target] =
      name === "send_email" ? [(a: Attempt) => this.sendEmail(step, a, args), String(args.to)] : [(a: Attempt) => this.chargeCard(step, a, args), String(args.customer)];
    let ran = 0;
    const fn = async (a: Attempt) => {
      ran = a.number;
      this.dieAt(step, "claimed");
      return effect(a);
    };
    let result: unknown;
    let intent: Intent;
    if (this.opts.keyBy === "tool-call-id") {
      // The counterexample: a key made from the model's id. A resumed
      // run's call has another id, so another key, and runs again.
      intent = { run: call.id, step: 0, kind: name, target, payload: { json: args } };
      result = await this.client.do(intent, fn, { waitMs: claimWaitMs });
    } else {
      intent = { run: this.opts.run, step, kind: name, target, payload: { json: args } };
      result = await this.run.do(name, fn, { target, payload: { json: args }, waitMs: claimWaitMs });
    }
    const how = ran === 0 ? "replayed" : ran > 1 ? `ran (attempt ${ran})` : "ran";
    const key = keysOf(intent)[0];
    say(`step ${step}  ${name.padEnd(11)}  ${target.padEnd(22)} ${how.padEnd(17)} key ${key.slice(0, 12)}  ${call.id}  ${summary(result)}`);
    return result;
  }

  // --- the effects ---

  /**
   * Sends one message over SMTP. Its Message-ID is made from the action's
   * key, the same on every attempt, so the verifier can ask the mail
   * provider whether it arrived. Errors before the final dot mean nothing
   * was delivered (RetryLater, or Permanent for a 5xx); an error after it
   * leaves the outcome unknown.
   */
  async sendEmail(step: number, a: Attempt, args: Args): Promise<{ message_id: string; reply: string }> {
    const headers = [
      `From: ${args.from}`,
      `To: ${args.to}`,
      `Subject: ${args.subject}`,
      `Message-ID: ${messageId(a.key)}`,
      `Date: ${new Date().toUTCString()}`,
      "MIME-Version: 1.0",
      "Content-Type: text/plain; charset=utf-8",
    ];
    const data = dotStuffed(headers.join("\r\n") + "\r\n\r\n" + String(args.body));
    const [host, port] = splitHostPort(this.opts.smtp);
    let conn: Smtp;
    try {
      conn = await Smtp.open(host, port, Math.max(1000, a.timeLeftMs()));
      for (const [cmd, want] of [
        ["", 220],
        [`EHLO ${os.hostname()}`, 250],
        [`MAIL FROM:<${args.from}>`, 250],
        [`RCPT TO:<${args.to}>`, 250],
        ["DATA", 354],
      ] as const) {
        if (cmd) await conn.write(cmd + "\r\n");
        const r = await conn.reply();
        if (r.code !== want) {
          const err = `the server answered ${JSON.stringify(cmd || "the greeting")} with ${r.code} ${r.text}`;
          throw r.code >= 500 ? new Permanent(err) : new RetryLater(err);
        }
      }
      const half = Math.floor(data.length / 2);
      await conn.write(data.subarray(0, half));
      this.dieAt(step, "mid");
      await conn.write(Buffer.concat([data.subarray(half), Buffer.from(".\r\n")]));
    } catch (e) {
      if (e instanceof Permanent || e instanceof RetryLater) throw e;
      throw new RetryLater(`the message was not sent whole: ${(e as Error).message}`);
    }
    // The message is on its way: from here on, only the reply says.
    this.dieAt(step, "sent");
    const r = await conn.reply(); // throws when the reply is lost: unknown
    this.dieAt(step, "replied");
    conn.quit();
    const reply = `${r.code} ${r.text}`;
    if (r.code >= 500) throw new Permanent("the server refused the message: " + reply);
    if (r.code >= 400) throw new RetryLater("the server did not take the message: " + reply);
    return { message_id: messageId(a.key), reply };
  }

  /**
   * Charges the card at the provider, with the attempt's providerKey as
   * Idempotency-Key: the same on every attempt of the step, so a retried
   * charge is answered from the provider's store.
   */
  async chargeCard(step: number, a: Attempt, args: Args): Promise<{ id: string; amount: number; replayed: boolean }> {
    const body = Buffer.from(JSON.stringify({ customer: args.customer, amount: args.amount, currency: args.currency }));
    const u = new URL(this.opts.provider);
    const req = http.request({
      host: u.hostname,
      port: Number(u.port || 80),
      method: "POST",
      path: "/v1/charges",
      headers: { "Idempotency-Key": a.providerKey, "Content-Type": "application/json", "Content-Length": body.length },
      timeout: Math.max(1000, a.timeLeftMs()),
    });
    const answer = new Promise<{ status: number; replayed: boolean; body: string }>((resolve, reject) => {
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, replayed: res.headers["idempotent-replayed"] === "true", body: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      });
      req.on("timeout", () => req.destroy(new Error("the provider did not answer in time")));
      req.on("error", reject);
    });
    answer.catch(() => {}); // awaited below; an error before then is the send's
    // Resolves when chunk is handed to the kernel, rejects when the
    // request fails first.
    const send = (chunk: Buffer, end: boolean) =>
      new Promise<void>((resolve, reject) => {
        const failed = (e: Error) => reject(e);
        req.once("error", failed);
        const done = () => {
          req.off("error", failed);
          resolve();
        };
        if (end) req.end(chunk, done);
        else req.write(chunk, (err) => (err ? reject(err) : done()));
      });
    const half = Math.floor(body.length / 2);
    try {
      await send(body.subarray(0, half), false);
      this.dieAt(step, "mid");
      await send(body.subarray(half), true);
    } catch (e) {
      throw new RetryLater(`the request was not sent whole: ${(e as Error).message}`);
    }
    this.dieAt(step, "sent");
    const res = await answer; // throws when the answer is lost: unknown
    this.dieAt(step, "replied");
    if (res.status === 409) {
      // A request with this key is still being answered: nothing new was
      // made by this one; the same call goes again.
      throw new RetryLater("the provider is still answering this key (409)");
    }
    if (res.status >= 400 && res.status < 500) throw new Permanent(`the provider refused the charge: ${res.status} ${res.body.slice(0, 200)}`);
    if (res.status !== 200) throw new Error(`the provider answered ${res.status}: the charge may have been made`);
    const charge = JSON.parse(res.body) as { id: string; amount: number };
    return { id: charge.id, amount: charge.amount, replayed: res.replayed };
  }
}

function messageId(key: string): string {
  return `<${key}@once>`;
}

/** text as SMTP's DATA carries it: CRLF lines, a leading dot doubled, ending with CRLF (the final dot follows). */
function dotStuffed(text: string): Buffer {
  const lines = text.replace(/\r\n/g, "\n").split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  return Buffer.from(lines.map((l) => (l.startsWith(".") ? "." + l : l) + "\r\n").join(""));
}

function splitHostPort(hp: string): [string, number] {
  const i = hp.lastIndexOf(":");
  if (i < 0 || !/^\d+$/.test(hp.slice(i + 1))) throw new Usage(`--smtp ${JSON.stringify(hp)} is not HOST:PORT`);
  return [hp.slice(0, i), Number(hp.slice(i + 1))];
}

function summary(result: unknown): string {
  if (result && typeof result === "object") {
    const r = result as Record<string, unknown>;
    if (typeof r.id === "string") return r.id + (r.replayed ? " (answered from the provider's idempotency store)" : "");
    return String(r.reply ?? r.found ?? JSON.stringify(r));
  }
  return JSON.stringify(result);
}

interface Reply {
  code: number;
  text: string;
}

/** The few lines of SMTP a client speaks: write a command, read its reply. */
class Smtp {
  private buf = "";
  private failed: Error | undefined;
  private waiting: { resolve: (r: Reply) => void; reject: (e: Error) => void } | undefined;

  private constructor(private readonly sock: net.Socket) {
    sock.setEncoding("utf8");
    sock.on("data", (d: string) => {
      this.buf += d;
      this.pump();
    });
    sock.on("error", (e) => this.fail(e));
    sock.on("close", () => this.fail(new Error("the server closed the connection")));
  }

  static open(host: string, port: number, timeoutMs: number): Promise<Smtp> {
    return new Promise((resolve, reject) => {
      const sock = net.connect({ host, port });
      sock.setTimeout(timeoutMs, () => sock.destroy(new Error("the server did not answer in time")));
      sock.once("error", reject);
      sock.once("connect", () => {
        sock.off("error", reject);
        resolve(new Smtp(sock));
      });
    });
  }

  write(data: string | Buffer): Promise<void> {
    return new Promise((resolve, reject) => this.sock.write(data, (err) => (err ? reject(err) : resolve())));
  }

  /** The next reply, its lines joined: "250-..." lines go on, "250 ..." ends it. */
  reply(): Promise<Reply> {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.pump();
    });
  }

  quit() {
    this.sock.end("QUIT\r\n");
  }

  private pump() {
    if (!this.waiting) return;
    const lines: string[] = [];
    let at = 0;
    for (let nl = this.buf.indexOf("\n", at); nl >= 0; nl = this.buf.indexOf("\n", at)) {
      const line = this.buf.slice(at, nl).replace(/\r$/, "");
      at = nl + 1;
      lines.push(line.slice(4));
      if (/^\d{3}(?: |$)/.test(line)) {
        this.buf = this.buf.slice(at);
        const w = this.waiting;
        this.waiting = undefined;
        w.resolve({ code: Number(line.slice(0, 3)), text: lines.join("\n") });
        return;
      }
    }
    if (this.failed) {
      const w = this.waiting;
      this.waiting = undefined;
      w.reject(this.failed);
    }
  }

  private fail(e: Error) {
    this.failed ??= e;
    this.pump();
  }
}

// --- the verifier --------------------------------------------------------------------

/**
 * The send_email kind's verifier (kinds.json: verify_then_decide,
 * "verifier": "client"). When recovery meets a dead claim of the kind,
 * the server asks; this loop takes the question (POST /v1/verify/take),
 * searches the mail provider for the Message-ID the attempt sent, and
 * answers: landed (found), not_landed (not there), or cannot_tell (the
 * search failed). The client has no verifier calls, so these are the
 * protocol's two routes, spoken directly.
 */
class Verifier {
  constructor(
    private readonly url: string,
    private readonly token: string,
    private readonly mailbox: string,
  ) {}

  private async post(path: string, body: unknown, timeoutMs: number): Promise<Record<string, unknown>> {
    const resp = await fetch(this.url.replace(/\/+$/, "") + path, {
      method: "POST",
      headers: { Authorization: "Bearer " + this.token, "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const v = (await resp.json().catch(() => ({}))) as Record<string, unknown>;
    if (!resp.ok) throw new OnceError({ code: String(v.code ?? ""), detail: String(v.detail ?? `HTTP ${resp.status}`) }, resp.status);
    return v;
  }

  async run(): Promise<void> {
    for (;;) {
      let got: Record<string, unknown>;
      try {
        got = await this.post("/v1/verify/take", { kinds: ["send_email"], wait_ms: 5000, max: 10 }, 20_000);
      } catch (e) {
        if (e instanceof OnceError && e.code === "not_client_verified") {
          say(`verify: the server does not ask clients to verify send_email (its kinds file): ${e.message}`);
          return;
        }
        await new Promise((r) => setTimeout(r, 1000));
        continue;
      }
      for (const q of (got.questions as Record<string, unknown>[] | undefined) ?? []) await this.answer(q);
    }
  }

  private async answer(q: Record<string, unknown>) {
    const mid = messageId(String(q.key));
    let verdict: Record<string, unknown>;
    try {
      const resp = await fetch(this.mailbox.replace(/\/+$/, "") + "/messages?" + new URLSearchParams({ message_id: mid }), { signal: AbortSignal.timeout(5000) });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const found = ((await resp.json()) as { messages?: unknown[] }).messages ?? [];
      verdict = found.length > 0 ? { verdict: "landed", result: { message_id: mid, found: "found in the mailbox" } } : { verdict: "not_landed" };
    } catch (e) {
      verdict = { verdict: "cannot_tell", error: `the mail provider's search failed: ${(e as Error).message}` };
    }
    say(`verify: step ${q.step} send_email attempt ${q.attempt}, Message-ID ${mid.slice(0, 13)}...: ${verdict.verdict}`);
    try {
      await this.post("/v1/verify/answer", { ...verdict, question: q.question }, 10_000);
    } catch (e) {
      say(`verify: the answer was not received: ${(e as Error).message}; the question is asked again`);
    }
  }
}

// --- main ---------------------------------------------------------------------------------

class Usage extends Error {}

async function main(argv: string[]): Promise<number> {
  let opts: Options;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        run: { type: "string" },
        customer: { type: "string" },
        smtp: { type: "string", default: "127.0.0.1:2525" },
        provider: { type: "string", default: "http://127.0.0.1:8025" },
        mailbox: { type: "string", default: "http://127.0.0.1:8026" },
        "key-by": { type: "string", default: "step" },
      },
    });
    if (!values.run || !values.customer) throw new Usage("--run ID and --customer ID are required");
    const keyBy = values["key-by"];
    if (keyBy !== "step" && keyBy !== "tool-call-id") throw new Usage(`--key-by is step or tool-call-id, not ${JSON.stringify(keyBy)}`);
    opts = { run: values.run, customer: values.customer, smtp: values.smtp!, provider: values.provider!, mailbox: values.mailbox!, keyBy };
    // Checked here: a flag that is wrong must not surface inside an
    // effect, where any error means its outcome is unknown.
    splitHostPort(opts.smtp);
    for (const [flag, url] of [
      ["--provider", opts.provider],
      ["--mailbox", opts.mailbox],
    ]) {
      if (!URL.canParse(url) || new URL(url).protocol !== "http:") throw new Usage(`${flag} ${JSON.stringify(url)} is not an http:// URL`);
    }
  } catch (e) {
    process.stderr.write(`agent: ${(e as Error).message}\n`);
    return 2;
  }
  const url = process.env.ONCE_URL;
  const token = process.env.ONCE_TOKEN;
  if (!url || !token) {
    process.stderr.write("agent: set ONCE_URL (the once server) and ONCE_TOKEN (a worker token)\n");
    return 2;
  }
  const client = new Client(url, token);
  let agent: Agent;
  try {
    agent = new Agent(opts, client);
  } catch (e) {
    process.stderr.write(`agent: ${(e as Error).message}\n`);
    return 2;
  }
  void new Verifier(url, token, opts.mailbox).run();
  say(`run ${opts.run}: once ${client.url}, smtp ${opts.smtp}, provider ${opts.provider}, keyed by ${opts.keyBy}`);
  try {
    const final = await agent.loop(new ScriptedModel(opts.run, opts.customer));
    say(`run ${opts.run} finished: ${agent.step} steps. ${final}`);
    return 0;
  } catch (e) {
    const name = e instanceof Error ? e.name : typeof e;
    const what = e instanceof Error ? e.message : String(e);
    if (e instanceof Review) {
      say(`run ${opts.run} stopped: step ${agent.step - 1} waits for a person: ${what}`);
      return 3;
    }
    if (dispose(e).action === "retry") {
      say(`run ${opts.run} stopped: step ${agent.step - 1} is not done yet (${name}: ${what}): run it again`);
      return 75;
    }
    say(`run ${opts.run} failed at step ${agent.step - 1}: ${name}: ${what}`);
    return 1;
  }
}

// The verifier's long poll would keep the process alive: exit when the run ends.
main(process.argv.slice(2)).then((code) => process.exit(code));
