// Keys and fingerprints of intents, as KEYS.md specifies them, with RFC
// 8785's canonical JSON: the client computes them to check the server's,
// so that a canonical form that drifted between the two is caught at the
// first claim (the server answers key_mismatch).
import { createHash } from "node:crypto";

/** A payload with no canonical form that keeps it apart from others. */
export class Refused extends Error {}

/**
 * The RFC 8785 canonical form of a JSON value. Numbers are already
 * doubles here, so ECMAScript's own serialisation is the canonical one;
 * strings with a lone surrogate and numbers that are not finite are
 * refused, as the server refuses them.
 */
export function canonical(v: unknown): string {
  if (v === null) return "null";
  switch (typeof v) {
    case "boolean":
      return v ? "true" : "false";
    case "number":
      if (!Number.isFinite(v)) throw new Refused("not a finite number: " + v);
      return JSON.stringify(v);
    case "string":
      return canonicalString(v);
    case "object":
      if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
      // UTF-16 code unit order, which is what sort() compares.
      return (
        "{" +
        Object.keys(v as object)
          .sort()
          .filter((k) => (v as Record<string, unknown>)[k] !== undefined)
          .map((k) => canonicalString(k) + ":" + canonical((v as Record<string, unknown>)[k]))
          .join(",") +
        "}"
      );
  }
  throw new Refused("not JSON: a " + typeof v);
}

const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function canonicalString(s: string): string {
  if (loneSurrogate.test(s)) throw new Refused("a string with an unpaired surrogate");
  return JSON.stringify(s);
}

function field(b: Buffer): Buffer {
  const len = Buffer.alloc(8);
  len.writeBigUInt64BE(BigInt(b.length));
  return Buffer.concat([len, b]);
}

const utf8 = (s: string) => Buffer.from(s, "utf8");

/** The payload of an intent: a JSON value, raw bytes, or none. */
export type Payload = { json: unknown } | { raw: Uint8Array } | undefined;

/** [key, fingerprint] of an intent (KEYS.md). */
export function keyOf(run: string, step: number, kind: string, target: string, payload: Payload, payloadInKey = false): [string, string] {
  let tag = "raw";
  let canon = Buffer.alloc(0);
  if (payload && "json" in payload) {
    tag = "json";
    canon = utf8(canonical(payload.json));
  } else if (payload && "raw" in payload) {
    canon = Buffer.from(payload.raw);
  }
  const fp = createHash("sha256")
    .update(Buffer.concat([field(utf8("once.payload.v2")), field(utf8(tag)), field(canon)]))
    .digest("hex");
  const key = createHash("sha256")
    .update(
      Buffer.concat([
        field(utf8("once.key.v2")),
        field(utf8(run)),
        field(utf8(String(step))),
        field(utf8(kind)),
        field(utf8(target)),
        field(payloadInKey ? utf8(fp) : Buffer.alloc(0)),
      ]),
    )
    .digest("hex");
  return [key, fp];
}
