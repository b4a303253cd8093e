// The review of the TypeScript client (branch review-protocol): each test
// here failed when it was written. They run against a real server: the
// Go test TestTypeScriptClientAdversary (package protocol) serves kind
// adv_short with a one-second lease; under `once serve`
// (TestTypeScriptClient) the test that needs that lease skips.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";

const url = () => process.env.ONCE_URL ?? "";
const token = () => process.env.ONCE_TOKEN ?? "";
const client = (o: once.ClientOptions = {}) => new once.Client(url(), token(), o);
const intent = (kind = "send_email"): once.Intent => ({ run: "ts-adv-" + randomUUID(), step: 0, kind, target: "ada@example.com" });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// A client whose claim's answer comes in after the claim's lease: the
// reply was slow on the way, or the process paused as it came in.
// during runs meanwhile.
class LateReply extends once.Client {
  during?: () => Promise<unknown>;
  override async call<T>(method: string, path: string, body?: unknown, budgetMs?: number): Promise<T> {
    const a = await super.call<T>(method, path, body, budgetMs);
    const r = a as { answer?: string; stop_after_ms?: number };
    if (path === "/v1/claim" && r.answer === "claimed" && this.during) {
      await sleep((r.stop_after_ms ?? 0) + 800); // past the lease the server holds, too
      const d = this.during;
      this.during = undefined;
      await d();
    }
    return a;
  }
}

test("do does not start the effect with its lease spent", async (t) => {
  const probe = await client().claim(intent("adv_short"));
  assert.ok("claimed" in probe);
  if (probe.claimed.timeLeftMs() > 5000) {
    await probe.claimed.succeed("probe");
    t.skip("needs kind adv_short served with a short lease (TestTypeScriptClientAdversary)");
    return;
  }
  await probe.claimed.succeed("probe");
  const i = intent("adv_short");
  const runs: number[] = [];
  // An effect that heeds the signal before it starts.
  const careful = async (a: once.Attempt) => {
    if (a.signal.aborted) throw new once.RetryLater("told to stop before it started");
    runs.push(a.number);
    return "sent";
  };
  const late = new LateReply(url(), token());
  const other = client();
  late.during = () => other.do(i, careful);
  await late.do(i, careful).catch(() => {});
  assert.deepEqual(runs.length, 1, `the effect ran ${runs.length} times: attempts ${runs}`);
});

test("a claim that waits longer than a request is answered", async () => {
  const c = client();
  const i = intent();
  const held = await c.claim(i);
  assert.ok("claimed" in held);
  try {
    const slow = client({ timeoutMs: 1000, retryForMs: 500 });
    await assert.rejects(slow.claim(i, { waitMs: 1500 }), (e: unknown) => {
      assert.ok(e instanceof once.InFlight, `a claim that waited 1.5 s with a 1 s request timeout: ${e}; want InFlight`);
      return true;
    });
  } finally {
    await held.claimed.succeed("ok");
  }
});
