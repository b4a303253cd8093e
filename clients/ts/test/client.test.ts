// The client against a real once server: $ONCE_URL, with a worker's token
// in $ONCE_TOKEN. The Go test TestTypeScriptClient (lab/cli) starts
// `once serve` over SQLite and over PostgreSQL and runs this suite
// against each.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";

function client(o: once.ClientOptions = {}): once.Client {
  const url = process.env.ONCE_URL;
  if (!url) throw new Error("set ONCE_URL and ONCE_TOKEN to a once server, or run the Go test TestTypeScriptClient, which starts one");
  return new once.Client(url, process.env.ONCE_TOKEN ?? "", o);
}

const intent = (payload?: once.Payload): once.Intent => ({ run: "ts-" + randomUUID(), step: 0, kind: "send_email", target: "ada@example.com", payload });

test("do runs the effect once and replays its result", async () => {
  const c = client();
  const i = intent({ json: { subject: "hello" } });
  let n = 0;
  const fn = async () => (n++, { id: "msg-1" });
  assert.deepEqual(await c.do(i, fn), { id: "msg-1" });
  assert.deepEqual(await c.do(i, fn), { id: "msg-1" });
  assert.equal(n, 1);
  assert.equal((await c.get(once.keysOf(i)[0])).status, "succeeded");
});

test("a duplicate meets the claim in flight; the attempt is fenced after its outcome", async () => {
  const c = client();
  const i = intent();
  const got = await c.claim(i);
  assert.ok("claimed" in got);
  const a = got.claimed;
  await assert.rejects(c.claim(i), (e: unknown) => e instanceof once.InFlight && e.retryAfterMs > 0 && once.dispose(e).action === "retry");
  await a.heartbeat();
  assert.ok(a.timeLeftMs() > 0);
  assert.equal(await a.succeed("ok"), "succeeded");
  await assert.rejects(a.heartbeat(), once.Fenced);
  assert.ok(a.signal.aborted);
});

test("a changed payload is refused", async () => {
  const c = client();
  const i = intent({ json: { n: 1 } });
  await c.do(i, async () => "sent");
  await assert.rejects(c.do({ ...i, payload: { json: { n: 2 } } }, async () => "again"), (e: unknown) => e instanceof once.FingerprintMismatch && once.dispose(e).action === "drop");
});

test("RetryLater releases; the next do runs it with the same provider key", async () => {
  const c = client();
  const i = intent();
  const keys: string[] = [];
  await assert.rejects(
    c.do(i, async (a) => {
      keys.push(a.providerKey);
      throw new once.RetryLater("429 slow down");
    }),
    once.RetryLater,
  );
  let attempt = 0;
  assert.equal(await c.do(i, async (a) => ((attempt = a.number), keys.push(a.providerKey), "sent")), "sent");
  assert.equal(attempt, 2);
  assert.equal(keys[0], keys[1]);
});

test("a permanent failure is told to every duplicate", async () => {
  const c = client();
  const i = intent();
  await assert.rejects(
    c.do(i, async () => {
      throw new once.Permanent("550 no such mailbox");
    }),
    once.Permanent,
  );
  let ran = false;
  await assert.rejects(
    c.do(i, async () => ((ran = true), "x")),
    (e: unknown) => e instanceof once.Failed && e.message.includes("550 no such mailbox") && once.dispose(e).action === "ack",
  );
  assert.equal(ran, false);
});

test("a claim sent again gets the same attempt", async () => {
  const c = client();
  const i = intent();
  const body = { intent: { run: i.run, step: 0, kind: i.kind, target: i.target }, write: once.writeToken() };
  const first = await c.call<Record<string, unknown>>("POST", "/v1/claim", body);
  const again = await c.call<Record<string, unknown>>("POST", "/v1/claim", body);
  assert.deepEqual([again.answer, again.attempt, again.token], ["claimed", first.attempt, first.token]);
});

test("a key computed otherwise is refused; the keys agree", async () => {
  const c = client();
  const i = intent({ json: { a: [1, 2.5, "ü"] } });
  await assert.rejects(c.call("POST", "/v1/claim", { intent: { run: i.run, step: 0, kind: i.kind }, write: once.writeToken(), key: "0".repeat(64) }), once.KeyMismatch);
  assert.deepEqual(await c.keys(i), once.keysOf(i));
});

test("an invalid intent names its field", async () => {
  await assert.rejects(client().claim({ run: "", step: 0, kind: "send_email" }), (e: unknown) => e instanceof once.InvalidIntent && e.problem.field === "Run");
});

test("a run numbers its steps, and a resumed run runs none again", async () => {
  const c = client();
  const id = "ts-run-" + randomUUID();
  const ran: string[] = [];
  for (let i = 0; i < 2; i++) {
    const r = c.run(id);
    await r.do("send_email", async () => (ran.push("mail"), "m"), { target: "ada@example.com" });
    await r.do("charge_card", async () => (ran.push("charge"), "c"), { target: "acct-1", payload: { json: { cents: 100 } } });
  }
  assert.deepEqual(ran, ["mail", "charge"]);
});

test("a wrong token is refused", async () => {
  await assert.rejects(new once.Client(process.env.ONCE_URL ?? "", "not-a-token-of-this-server").claim(intent()), once.Unauthorized);
});

test("an unreachable server is said to be", async () => {
  const c = new once.Client("http://127.0.0.1:9", "x".repeat(20), { timeoutMs: 500, retryForMs: 300 });
  await assert.rejects(c.claim(intent()), once.Unreachable);
});

test("a raw payload", async () => {
  const c = client();
  const i = intent({ raw: Buffer.from('"hi"') });
  await c.do(i, async () => "sent");
  assert.equal((await c.get(once.keysOf(i)[0])).fingerprint, once.keysOf(i)[1]);
});
