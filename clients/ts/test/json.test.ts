// Values that are not JSON, or that JSON.stringify would send as
// something else: a payload is refused before any request, naming its
// path; an effect's result is recorded as outcome unknown, naming its
// path, so the attempt is not left in flight.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as once from "../src/index.js";

const client = () => new once.Client(process.env.ONCE_URL ?? "", process.env.ONCE_TOKEN ?? "");
const intent = (payload?: once.Payload): once.Intent => ({ run: "ts-json-" + randomUUID(), step: 0, kind: "send_email", target: "ada@example.com", payload });
// A server nobody answers at: a request sent would be Unreachable.
const nowhere = new once.Client("http://127.0.0.1:9", "x".repeat(20), { timeoutMs: 500, retryForMs: 100 });

class Money {
  constructor(readonly cents: number) {}
}

test("a payload that is not JSON is refused before any request, by path", async () => {
  const loop: unknown[] = [];
  loop.push(loop);
  const holes = [1, , 3]; // eslint-disable-line no-sparse-arrays
  const withToJSON = { toJSON: () => "x" };
  const cases: [unknown, string][] = [
    [{ amount: NaN }, "payload.amount: the number NaN is not JSON"],
    [{ amount: -Infinity }, "payload.amount: the number -Infinity is not JSON"],
    [{ id: 2n ** 64n }, "payload.id: the bigint 18446744073709551616n is not JSON"],
    [{ at: new Date(0) }, "payload.at: a Date is not JSON: send date.toISOString()"],
    [{ tags: new Set(["a"]) }, "payload.tags: a Set is not JSON"],
    [{ by: new Map([["a", 1]]) }, "payload.by: a Map is not JSON"],
    [{ re: /x/ }, "payload.re: a RegExp is not JSON"],
    [{ body: Buffer.from("hi") }, "payload.body: a Buffer is not JSON"],
    [{ body: new Uint8Array(2) }, "payload.body: a Uint8Array is not JSON"],
    [{ price: new Money(100) }, "payload.price: a Money is not JSON: send a plain object"],
    [{ name: new String("ada") }, "payload.name: a boxed String is not JSON"],
    [{ n: withToJSON }, "payload.n: an object with toJSON is not JSON as it is"],
    [{ send: () => 1 }, "payload.send: a function is not JSON"],
    [{ s: Symbol("x") }, "payload.s: a symbol is not JSON"],
    [{ to: ["ada", undefined] }, "payload.to[1]: undefined in an array is not JSON"],
    [{ to: holes }, "payload.to[1]: a hole in an array is not JSON"],
    [{ "a b": loop }, 'payload["a b"][0]: a circular reference is not JSON'],
    [{ s: "\ud800" }, "payload.s: a string with an unpaired surrogate is not JSON"],
    [undefined, "payload: undefined is not JSON"],
  ];
  for (const [json, want] of cases) {
    await assert.rejects(nowhere.claim(intent({ json })), (e: unknown) => {
      assert.ok(e instanceof once.NotJSON, `${want}: got ${e}`); // never Unreachable: nothing was sent
      assert.ok(e.message.startsWith(want), `got ${JSON.stringify(e.message)}, want ${JSON.stringify(want)}`);
      assert.equal(once.dispose(e).action, "drop");
      return true;
    });
    assert.throws(() => once.keysOf(intent({ json })), once.NotJSON);
  }
});

test("-0 is 0, an undefined member is left out", async () => {
  const a = intent({ json: { n: -0, skip: undefined } });
  const b = { ...a, payload: { json: { n: 0 } } };
  assert.deepEqual(once.keysOf(a), once.keysOf(b));
  const c = client();
  assert.equal(await c.do(a, async () => "sent"), "sent");
  assert.equal(await c.do(b, async () => "again"), "sent"); // the same intent: replayed
});

test("a result's text is sent as it is", async () => {
  // String.replace reads "$&" and "$'" in its replacement as patterns.
  const c = client();
  const i = intent();
  const result = { price: "$'5 $& $$ $`" };
  assert.deepEqual(await c.do(i, async () => result), result);
  assert.deepEqual(await c.do(i, async () => "again"), result);
});

test("a result that is not JSON is recorded unknown", async () => {
  const c = client();
  const i = intent();
  await assert.rejects(
    c.do(i, async () => ({ items: [1, 2, new Set([3])] })),
    (e: unknown) => {
      assert.ok(e instanceof once.ResultNotJSON, String(e));
      assert.equal(e.message, "result.items[2]: a Set is not JSON: send an array");
      assert.deepEqual([e.path, e.key, e.attempt], ["result.items[2]", once.keysOf(i)[0], 1]);
      assert.equal(once.dispose(e).action, "drop");
      return true;
    },
  );
  const a = await c.get(once.keysOf(i)[0]);
  assert.notEqual(a.status, "in_flight");
  assert.match(String(a.error), /result\.items\[2\]: a Set is not JSON/);
});

test("succeed refuses a result that is not JSON before sending", async () => {
  const c = client();
  const i = intent();
  const got = await c.claim(i);
  assert.ok("claimed" in got);
  const a = got.claimed;
  await assert.rejects(a.succeed({ n: 10n }), once.NotJSON);
  assert.equal((await c.get(once.keysOf(i)[0])).status, "in_flight"); // still held: the caller settles it
  assert.ok(a.timeLeftMs() > 0);
  assert.equal(await a.succeed({ n: 10 }), "succeeded");
  assert.deepEqual(await c.do(i, async () => null), { n: 10 });
});

test("an error's text is cut to what the server takes", async () => {
  // Uncut, the outcome would be refused (bad_request), and do would
  // reject with that instead of Permanent.
  const c = client();
  const i = intent();
  await assert.rejects(
    c.do(i, async () => {
      throw new once.Permanent("550 no such mailbox " + "é".repeat(20_000));
    }),
    once.Permanent,
  );
  const a = await c.get(once.keysOf(i)[0]);
  assert.equal(a.status, "failed");
  assert.ok(String(a.error).startsWith("550 no such mailbox"), String(a.error).slice(0, 100));
});
