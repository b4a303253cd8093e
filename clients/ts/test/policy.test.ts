// A Policy carried by claims, heartbeats and outcomes (protocol/carried.go):
// what the server applies to a kind it does not pin, and refuses for one it
// pins ($ONCE_PINNED_KIND, pinned by the kinds file of lab/cli clientKinds
// with a two-second lease).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";

const client = (o: once.ClientOptions = {}) => new once.Client(process.env.ONCE_URL ?? "", process.env.ONCE_TOKEN ?? "", o);
const unpinned = () => "ts_carried_" + randomUUID().slice(0, 8);
const intent = (kind: string): once.Intent => ({ run: "ts-pol-" + randomUUID(), step: 0, kind, target: "ada@example.com" });

async function claimed(c: once.Client, i: once.Intent, o: once.ClaimOptions = {}): Promise<once.Attempt> {
  const got = await c.claim(i, o);
  assert.ok("claimed" in got, "not claimed");
  return got.claimed;
}

test("a carried lease is the claim's, and its heartbeats'", async () => {
  const c = client();
  const a = await claimed(c, intent(unpinned()), { policy: { leaseMs: 5000 } });
  assert.ok(a.timeLeftMs() <= 5000);
  assert.equal(a.heartbeatEveryMs, 1666); // a third of the carried lease
  await a.heartbeat(); // renews the carried lease, not the server's default
  assert.ok(a.timeLeftMs() <= 5000, `${a.timeLeftMs()} ms left after a heartbeat`);
  assert.equal(await a.succeed("ok"), "succeeded");
  const plain = await claimed(c, intent(unpinned()));
  assert.ok(plain.timeLeftMs() > 5000, "the server's default lease is 5 s or less: the test tells nothing");
  await plain.succeed("ok");
});

test("the client's policies, do's and a run's", async () => {
  const kind = unpinned();
  const c = client({ policies: { [kind]: { leaseMs: 4000, maxExecutionMs: 30_000 } } });
  const seen: [number, number][] = [];
  const fn = async (a: once.Attempt) => (seen.push([a.timeLeftMs(), a.heartbeatEveryMs]), "ok");
  assert.equal(await c.do(intent(kind), fn), "ok");
  assert.ok(seen[0][0] <= 4000);
  assert.equal(seen[0][1], 1333);
  assert.equal(await c.do(intent(unpinned()), fn, { policy: { leaseMs: 2000 } }), "ok");
  assert.ok(seen[1][0] <= 2000);
  assert.equal(await c.run("ts-run-" + randomUUID()).do(unpinned(), fn, { policy: { leaseMs: 3000 } }), "ok");
  assert.ok(seen[2][0] <= 3000);
});

test("a carried recovery applies to the outcome", async () => {
  // Under the server's default (ask_person) an unknown outcome goes to
  // review; carried retry_with_provider_key, it is run again.
  const c = client();
  const i = intent(unpinned());
  const policy: once.Policy = { recovery: "retry_with_provider_key" };
  const keys: string[] = [];
  await assert.rejects(
    c.do(
      i,
      async (a) => {
        keys.push(a.providerKey);
        throw new Error("connection reset by the provider");
      },
      { policy },
    ),
    /connection reset/,
  );
  const runs: [number, string][] = [];
  assert.equal(await c.do(i, async (a) => (runs.push([a.number, a.providerKey]), "sent"), { policy }), "sent");
  assert.deepEqual(runs, [[2, keys[0]]]);
});

test("a pinned kind refuses another policy", async (t) => {
  const kind = process.env.ONCE_PINNED_KIND;
  if (!kind) return t.skip("needs $ONCE_PINNED_KIND, a kind the server pins (TestTypeScriptClient)");
  const c = client();
  await assert.rejects(c.claim(intent(kind), { policy: { leaseMs: 7000 } }), (e: unknown) => {
    assert.ok(e instanceof once.PolicyPinned, String(e));
    assert.match(e.message, /pinned/);
    assert.equal(once.dispose(e).action, "drop");
    return true;
  });
  const same = await claimed(c, intent(kind), { policy: { leaseMs: 2000 } }); // the server's own
  assert.ok(same.timeLeftMs() <= 2000);
  await same.succeed("ok");
  const plain = await claimed(c, intent(kind));
  assert.ok(plain.timeLeftMs() <= 2000);
  await plain.succeed("ok");
});

test("a policy out of bounds is refused", async () => {
  await assert.rejects(client().claim(intent(unpinned()), { policy: { leaseMs: 500 } }), (e: unknown) => e instanceof once.BadRequest && /lease_ms/.test(e.message));
});

test("a policy's wire form", () => {
  assert.equal(once.policyWire({}), undefined);
  assert.deepEqual(once.policyWire({ leaseMs: 1500, retentionMs: 86_400_000, recovery: "ask_person" }), { lease_ms: 1500, retention_ms: 86_400_000, recovery: "ask_person" });
});
