// The outcome goes out when the effect ends, not after a heartbeat stuck
// on the network gives up; and a heartbeat gives up with the lease.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";
import { Proxy } from "./proxy.js";

const url = () => process.env.ONCE_URL ?? "";
const token = () => process.env.ONCE_TOKEN ?? "";
const intent = (): once.Intent => ({ run: "ts-ord-" + randomUUID(), step: 0, kind: "ts_ordering_" + randomUUID().slice(0, 8), target: "ada@example.com" });

// A client that counts its heartbeats in flight, and how many there were
// when each outcome was sent.
class Counting extends once.Client {
  beats = 0;
  readonly atOutcome: number[] = [];
  override async call<T>(method: string, path: string, body?: unknown, budgetMs?: number, timeoutMs?: number, signal?: AbortSignal): Promise<T> {
    if (path === "/v1/outcome") this.atOutcome.push(this.beats);
    if (path !== "/v1/heartbeat") return super.call<T>(method, path, body, budgetMs, timeoutMs, signal);
    this.beats++;
    try {
      return await super.call<T>(method, path, body, budgetMs, timeoutMs, signal);
    } finally {
      this.beats--;
    }
  }
}

test("the outcome is not held back by a stuck heartbeat", async (t) => {
  const p = await Proxy.start(url());
  t.after(() => p.close());
  let heldOne!: () => void;
  const held = new Promise<void>((r) => (heldOne = r));
  let outcomeSent!: () => void;
  const outcome = new Promise<void>((r) => (outcomeSent = r));
  let first = true;
  p.hold = async (path) => {
    if (path === "/v1/heartbeat" && first) {
      first = false;
      heldOne();
      await Promise.race([outcome, new Promise((r) => setTimeout(r, 30_000))]); // the server never sees it while the effect runs
    } else if (path === "/v1/outcome") outcomeSent();
  };
  const c = new Counting(p.url, token());
  const effect = async () => {
    await Promise.race([held, new Promise((r) => setTimeout(r, 10_000))]);
    return "sent";
  };
  assert.equal(await c.do(intent(), effect, { policy: { leaseMs: 3000 } }), "sent");
  assert.deepEqual(c.atOutcome, [1], "the outcome waited for the stuck heartbeat to give up");
});

test("a heartbeat is bounded by the lease", async (t) => {
  const p = await Proxy.start(url());
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  t.after(() => (release(), p.close()));
  // Held for 20 s, then answered: a heartbeat that waited that long (its
  // request's timeout is 600 s) would get the answer.
  p.hold = async (path) => {
    if (path === "/v1/heartbeat") await Promise.race([released, new Promise((r) => setTimeout(r, 20_000))]);
  };
  const c = new once.Client(p.url, token(), { timeoutMs: 600_000 });
  const got = await c.claim(intent(), { policy: { leaseMs: 2000 } });
  assert.ok("claimed" in got);
  const a = got.claimed;
  const sent = performance.now();
  await assert.rejects(a.heartbeat(), (e: unknown) => e instanceof once.Unreachable && /timeout/.test(e.message)); // gives up with the lease
  assert.ok(performance.now() - sent < 5000, `the heartbeat took ${performance.now() - sent} ms`);
  assert.ok(a.timeLeftMs() < 50, `${a.timeLeftMs()} ms left`);
  await a.release("the test is over").catch(() => {});
});
