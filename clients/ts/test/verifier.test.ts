// The client verifier (Verifier, Client.verify, Client.verifyOnce) against
// a real server whose kinds file has $ONCE_VERIFIED_KIND verified by
// clients, with a one-second lease (lab/cli clientKinds). The server's
// reaper is off: a duplicate's claim meets the dead claim and recovers it
// inline, asking the verifier, as docs/protocol.md says.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";
import { Proxy } from "./proxy.js";

const url = () => process.env.ONCE_URL ?? "";
const token = () => process.env.ONCE_TOKEN ?? "";
const client = () => new once.Client(url(), token());
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const quiet = { log: () => {} };

function verifiedKind(t: TestContext): string | undefined {
  const k = process.env.ONCE_VERIFIED_KIND;
  if (!k) t.skip("needs $ONCE_VERIFIED_KIND, a kind the server has verified by clients (TestTypeScriptClient)");
  return k;
}

// An intent of the verified kind whose claim's worker died: its lease has
// lapsed, by the server's clock too.
async function deadClaim(c: once.Client, kind: string, payload: unknown = { subject: "hello" }): Promise<[once.Intent, once.Attempt]> {
  const i: once.Intent = { run: "ts-ver-" + randomUUID(), step: 0, kind, target: "ada@example.com", payload: { json: payload } };
  const got = await c.claim(i);
  assert.ok("claimed" in got);
  const a = got.claimed;
  a.done(); // its worker died
  await sleep(a.timeLeftMs());
  // The client's count starts when it sent the claim, before the server
  // made it: wait until the server's clock has the lease lapsed too, or
  // a loaded machine's duplicate meets a claim still held.
  for (const end = Date.now() + 30_000; (await c.get(a.key)).lease_left_ms; ) {
    if (Date.now() > end) assert.fail("the dead claim's lease did not lapse by the server's clock");
    await sleep(50);
  }
  return [i, a];
}

test("landed decides the dead claim", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  const c = client();
  const [i, dead] = await deadClaim(c, kind);
  const asked: once.Question[] = [];
  const answering = c.verifyOnce(kind, (q) => (asked.push(q), once.landed({ id: "msg-1" })), { waitMs: 10_000 });
  const got = await c.claim(i); // the duplicate meets the dead claim: recovery asks
  assert.equal(await answering, 1);
  assert.ok("replayed" in got, "not replayed");
  assert.deepEqual(got.replayed.result, { id: "msg-1" });
  const q = asked[0];
  assert.deepEqual([q.key, q.attempt, q.kind, q.run, q.step, q.target], [dead.key, 1, kind, i.run, 0, i.target]);
  assert.deepEqual([q.providerKey, q.payload, q.raw], [dead.providerKey, { subject: "hello" }, undefined]);
  assert.ok(q.answerWithinMs > 0);
  const a = await c.get(dead.key);
  assert.deepEqual([a.status, a.attempt, a.result], ["succeeded", 1, { id: "msg-1" }]);
});

test("not landed runs it again", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  const c = client();
  const [i, dead] = await deadClaim(c, kind);
  const stop = new AbortController();
  const asked: string[] = [];
  const loop = c.verify(kind, (q) => (asked.push(q.key), q.key === dead.key ? once.notLanded() : once.cannotTell("not this test's question")), {
    signal: stop.signal,
    waitMs: 1000,
    ...quiet,
  });
  const runs: [number, string][] = [];
  try {
    assert.deepEqual(await c.do(i, async (a) => (runs.push([a.number, a.providerKey]), { id: "msg-2" })), { id: "msg-2" });
  } finally {
    stop.abort();
  }
  await Promise.race([loop, sleep(15_000).then(() => assert.fail("the verifier loop did not end when its signal aborted"))]);
  assert.deepEqual(asked, [dead.key]);
  assert.deepEqual(runs, [[2, dead.providerKey]]);
  const a = await c.get(dead.key);
  assert.deepEqual([a.status, a.attempt], ["succeeded", 2]);
});

// A claim of a dead claim's intent, asked again while recovery has not decided.
async function claimUntilDecided(c: once.Client, i: once.Intent, forMs: number): Promise<once.ClaimResult> {
  const end = performance.now() + forMs;
  for (;;) {
    try {
      return await c.claim(i);
    } catch (e) {
      if (!(e instanceof once.OutcomeUnknown || e instanceof once.InFlight) || performance.now() > end) throw e;
      await sleep(Math.max(e.retryAfterMs, 200));
    }
  }
}

test("a verifier that throws cannot tell", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  const c = client();
  const [i, dead] = await deadClaim(c, kind);
  const broken = () => {
    throw new Error("the provider's search is down " + "x".repeat(40_000)); // over what the server keeps
  };
  let answering = c.verifyOnce(kind, broken, { waitMs: 10_000 });
  await assert.rejects(c.claim(i), (e: unknown) => e instanceof once.OutcomeUnknown || e instanceof once.InFlight);
  assert.equal(await answering, 1, "the cannot_tell answer was not received");
  assert.equal((await c.get(dead.key)).attempt, 1);
  // Asked again after the kind's verify_backoff: this time it landed.
  answering = c.verifyOnce(kind, () => once.landed("found"), { waitMs: 15_000 });
  const got = await claimUntilDecided(c, i, 15_000);
  assert.equal(await answering, 1);
  assert.ok("replayed" in got);
  assert.equal(got.replayed.result, "found");
});

test("a result that is not JSON, or a verdict that is none, cannot tell", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  const c = client();
  const q = new once.Question({ question: "q", key: "k", attempt: 1, kind }, performance.now());
  const v = c.verifier(kind, () => once.landed({ ids: new Set([1, 2]) }));
  assert.equal((await v.verdict(q)).verdict, "cannot_tell");
  const none = c.verifier(kind, () => ({ verdict: "maybe" }) as unknown as once.Verdict);
  assert.match(String((await none.verdict(q)).error), /not landed\(\), notLanded\(\) or cannotTell\(\)/);
  const [i, dead] = await deadClaim(c, kind);
  const answering = c.verifier(kind, () => once.landed({ at: new Date() }), { waitMs: 10_000 }).verifyOnce();
  await assert.rejects(c.claim(i), (e: unknown) => e instanceof once.OutcomeUnknown || e instanceof once.InFlight);
  assert.equal(await answering, 1);
  assert.notEqual((await c.get(dead.key)).status, "succeeded");
});

test("an answer is sent again when its reply is lost", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  const p = await Proxy.start(url());
  t.after(() => p.close());
  let cut = false;
  p.cut = (path) => {
    if (path !== "/v1/verify/answer" || cut) return false;
    cut = true;
    return true;
  };
  const c = client();
  const via = new once.Client(p.url, token());
  const [i] = await deadClaim(c, kind);
  const answering = via.verifyOnce(kind, () => once.landed({ id: "msg-3" }), { waitMs: 10_000 });
  const got = await c.claim(i);
  assert.equal(await answering, 1);
  assert.ok("replayed" in got);
  assert.deepEqual(got.replayed.result, { id: "msg-3" });
  const answers = p.seen.filter(([path]) => path === "/v1/verify/answer").map(([, b]) => JSON.parse(b));
  assert.equal(answers.length, 2, "the answer whose reply was lost was not sent again");
  assert.deepEqual(answers[0], answers[1]);
});

test("a take of a kind not verified by clients is refused", async () => {
  await assert.rejects(client().verifyOnce("send_email", () => once.notLanded(), { waitMs: 0 }), once.NotClientVerified);
  const stop = new AbortController();
  await assert.rejects(client().verify(["send_email"], () => once.notLanded(), { signal: stop.signal, ...quiet }), once.NotClientVerified);
});

test("verifyOnce with no question", async (t) => {
  const kind = verifiedKind(t);
  if (!kind) return;
  assert.equal(await client().verifyOnce(kind, () => once.notLanded(), { waitMs: 200 }), 0);
});
