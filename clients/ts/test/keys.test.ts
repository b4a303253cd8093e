// The client's keys agree with every vector of KEYS.md.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { keysOf } from "../src/index.js";

const vectorsPath = new URL("../../../../testdata/keys/vectors.json", import.meta.url);

test("keys agree with the vectors", () => {
  const { vectors } = JSON.parse(readFileSync(vectorsPath, "utf8"));
  assert.ok(vectors.length > 10);
  for (const v of vectors) {
    const i = v.intent;
    const p = i.payload;
    const payload = p === null ? undefined : "raw_hex" in p ? { raw: Buffer.from(p.raw_hex, "hex") } : { json: JSON.parse(p.json) };
    const got = keysOf({ run: i.run, step: i.step, kind: i.kind, target: i.target, payload, payloadInKey: i.payload_in_key });
    assert.deepEqual(got, [v.key, v.fingerprint], v.name);
  }
});
