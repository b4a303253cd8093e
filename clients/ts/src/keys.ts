// Keys and fingerprints of intents, as KEYS.md specifies them, with RFC
// 8785's canonical JSON: the client computes them to check the server's,
// so that a canonical form that drifted between the two is caught at the
// first claim (the server answers key_mismatch).
import { createHash } from "node:crypto";

/** A payload with no canonical form that keeps it apart from others. */
export class Refused extends Error {
  override name = "Refused";
}

/**
 * A value that is not JSON, or whose JSON another language would read
 * otherwise: path names where (payload.items[2], result["a b"]), reason
 * what. Nothing was sent for it.
 */
export class NotJSON extends Refused {
  override name = "NotJSON";
  constructor(
    readonly path: string,
    readonly reason: string,
  ) {
    super(`${path}: ${reason}`);
  }
}

const identifier = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

// What a value JSON.stringify would turn into something else is, and
// what to send instead.
function notPlain(v: object): string {
  if (v instanceof Date) return "a Date is not JSON: send date.toISOString()";
  if (v instanceof Map) return "a Map is not JSON: send Object.fromEntries(map)";
  if (v instanceof Set) return "a Set is not JSON: send an array";
  if (v instanceof RegExp) return "a RegExp is not JSON: send its source";
  if (ArrayBuffer.isView(v) || v instanceof ArrayBuffer) {
    const name = v.constructor?.name ?? "typed array";
    return `a ${name} is not JSON: send a raw payload, or the bytes as base64 text`;
  }
  if (v instanceof Number || v instanceof String || v instanceof Boolean)
    return `a boxed ${v.constructor.name} is not JSON: send the primitive (valueOf())`;
  const name = (v.constructor as { name?: string } | undefined)?.name;
  return `${name ? "a " + name : "an object of a class"} is not JSON: send a plain object`;
}

/**
 * The RFC 8785 canonical form of a JSON value, path naming it in a
 * refusal. Numbers are already doubles here, so ECMAScript's own
 * serialisation is the canonical one (-0 is 0). Refused, as NotJSON
 * naming the path, is all JSON.stringify would send as something else
 * or drop without a word: numbers that are not finite, strings with a
 * lone surrogate, a bigint, a function, a symbol, undefined or a hole in
 * an array, a cycle, an object with toJSON, a Date, Map, Set, RegExp,
 * typed array or Buffer, a boxed primitive, an instance of a class. An
 * object's member whose value is undefined is dropped, as
 * JSON.stringify drops it.
 */
export function canonical(v: unknown, path = "payload"): string {
  const stack = new Set<object>();
  const walk = (v: unknown, path: string): string => {
    if (v === null) return "null";
    switch (typeof v) {
      case "boolean":
        return v ? "true" : "false";
      case "number":
        if (!Number.isFinite(v)) throw new NotJSON(path, `the number ${v} is not JSON`);
        return JSON.stringify(v);
      case "string":
        if (loneSurrogate.test(v)) throw new NotJSON(path, "a string with an unpaired surrogate is not JSON: it has no UTF-8 form");
        return JSON.stringify(v);
      case "bigint":
        throw new NotJSON(path, `the bigint ${v}n is not JSON: send a number (exact to 2**53) or a string`);
      case "undefined":
        throw new NotJSON(path, "undefined is not JSON: send null, or leave the member out");
      case "function":
      case "symbol":
        throw new NotJSON(path, `a ${typeof v} is not JSON`);
    }
    const o = v as object;
    if (stack.has(o)) throw new NotJSON(path, "a circular reference is not JSON");
    stack.add(o);
    let out: string;
    if (Array.isArray(o)) {
      const parts: string[] = [];
      for (let i = 0; i < o.length; i++) {
        if (!(i in o)) throw new NotJSON(`${path}[${i}]`, "a hole in an array is not JSON: JSON.stringify would send null");
        if (o[i] === undefined) throw new NotJSON(`${path}[${i}]`, "undefined in an array is not JSON: JSON.stringify would send null");
        parts.push(walk(o[i], `${path}[${i}]`));
      }
      out = "[" + parts.join(",") + "]";
    } else {
      const proto = Object.getPrototypeOf(o);
      if (proto !== Object.prototype && proto !== null) throw new NotJSON(path, notPlain(o));
      const rec = o as Record<string, unknown>;
      if (typeof rec.toJSON === "function") throw new NotJSON(path, "an object with toJSON is not JSON as it is: send what its toJSON returns");
      if (Object.getOwnPropertySymbols(o).some((s) => Object.prototype.propertyIsEnumerable.call(o, s)))
        throw new NotJSON(path, "a symbol key is not JSON: keys are strings");
      // UTF-16 code unit order, which is what sort() compares.
      const parts: string[] = [];
      for (const k of Object.keys(o).sort()) {
        const at = identifier.test(k) ? `${path}.${k}` : `${path}[${JSON.stringify(k)}]`;
        if (loneSurrogate.test(k)) throw new NotJSON(at, "a key with an unpaired surrogate is not JSON: it has no UTF-8 form");
        if (rec[k] === undefined) continue;
        parts.push(JSON.stringify(k) + ":" + walk(rec[k], at));
      }
      out = "{" + parts.join(",") + "}";
    }
    stack.delete(o);
    return out;
  };
  return walk(v, path);
}

const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

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
