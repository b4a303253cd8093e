#!/usr/bin/env python3
"""Computes the key and fingerprint test vectors of KEYS.md from the spec
alone, with its own RFC 8785 implementation: nothing here is shared with
the Go code, so agreement between the two is evidence that both follow
the spec.

    python3 testdata/keys/keyvectors.py           # print the vectors
    python3 testdata/keys/keyvectors.py --check   # compare with vectors.json and KEYS.md
    python3 testdata/keys/keyvectors.py --write   # rewrite vectors.json, and KEYS.md's
                                                  # vectors and worked example

Each run first checks its RFC 8785 code against the RFC's own examples
and number samples and against numbers ECMAScript serialised
(testdata/jcs). Python 3.8 or later; standard library only.
"""

import decimal
import hashlib
import json
import math
import os
import struct
import sys

KEY_DOMAIN = b"once.key.v2"
PAYLOAD_DOMAIN = b"once.payload.v2"
RAW_TAG = b"raw"
JSON_TAG = b"json"

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "vectors.json")
KEYS_MD = os.path.join(HERE, "..", "..", "KEYS.md")
BEGIN = "<!-- vectors:begin -->"
END = "<!-- vectors:end -->"


class Refused(ValueError):
    """The payload has no canonical form that keeps it apart from others."""


# --- RFC 8785 -------------------------------------------------------------


class Object(list):
    """A JSON object's members in document order (a list of pairs)."""


class Number:
    """A JSON number as written, so that exactness can be checked."""

    def __init__(self, text):
        self.text = text


def es_number(x):
    """ECMAScript Number::toString for a finite double (RFC 8785 3.2.2.3)."""
    if math.isnan(x) or math.isinf(x):
        raise Refused("not a finite number")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that read back as the same double,
    # the closest to it when several are that short: ECMAScript's s.
    d = decimal.Decimal(repr(abs(x))).normalize()
    _, digits, exp = d.as_tuple()
    s = "".join(map(str, digits))
    k = len(s)
    n = exp + k  # the value is 0.s * 10**n
    if k <= n <= 21:
        return sign + s + "0" * (n - k)
    if 0 < n <= 21:
        return sign + s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + s
    e = n - 1
    mant = s if k == 1 else s[0] + "." + s[1:]
    return sign + mant + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def canonical_number(text, strict):
    x = float(text)  # correctly rounded to the nearest double
    if math.isinf(x):
        raise Refused("number out of range: " + text)
    out = es_number(x)
    # once refuses a number whose canonical form has another value.
    if strict and decimal.Decimal(text) != decimal.Decimal(out):
        raise Refused("number %s would become %s" % (text, out))
    return out


def canonical_string(s):
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x20:
            out.append("\\u%04x" % c)
        elif 0xD800 <= c <= 0xDFFF:
            raise Refused("unpaired surrogate")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def utf16_key(name):
    return name.encode("utf-16-be", "surrogatepass")


def serialise(v, strict):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Number):
        return canonical_number(v.text, strict)
    if isinstance(v, str):
        return canonical_string(v)
    if isinstance(v, list) and not isinstance(v, Object):
        return "[" + ",".join(serialise(e, strict) for e in v) + "]"
    members = sorted(v, key=lambda kv: utf16_key(kv[0]))
    return "{" + ",".join(canonical_string(k) + ":" + serialise(e, strict) for k, e in members) + "}"


def no_duplicates(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise Refused("duplicate key " + k)
        seen.add(k)
    return Object(pairs)  # serialise sorts the members


def refuse_constant(name):
    raise Refused("not JSON: " + name)


def jcs(text, strict=True):
    """RFC 8785 canonical form of JSON text (bytes), as bytes. strict adds
    once's one restriction: a number whose canonical form has another value
    is refused."""
    s = text.decode("utf-8")  # strict: invalid UTF-8 is refused
    v = json.loads(
        s,
        object_pairs_hook=no_duplicates,
        parse_float=Number,
        parse_int=Number,
        parse_constant=refuse_constant,
    )
    return serialise(v, strict).encode("utf-8")


# --- the key and the fingerprint (KEYS.md) ----------------------------------


def field(b):
    return struct.pack(">Q", len(b)) + b


def payload_preimage(tag, canonical):
    return field(PAYLOAD_DOMAIN) + field(tag) + field(canonical)


def key_preimage(run, step, kind, target, fingerprint, payload_in_key):
    return (
        field(KEY_DOMAIN)
        + field(run.encode("utf-8"))
        + field(str(step).encode("ascii"))
        + field(kind.encode("utf-8"))
        + field(target.encode("utf-8"))
        + field(fingerprint.encode("ascii") if payload_in_key else b"")
    )


def vector(name, run, step, kind, target, payload=None, payload_in_key=False):
    """payload: None, ("json", text) or ("raw", bytes)."""
    if payload is None:
        tag, canonical, given = RAW_TAG, b"", None
    elif payload[0] == "json":
        tag, canonical, given = JSON_TAG, jcs(payload[1].encode("utf-8")), {"json": payload[1]}
    else:
        tag, canonical, given = RAW_TAG, payload[1], {"raw_hex": payload[1].hex()}
    fp = hashlib.sha256(payload_preimage(tag, canonical)).hexdigest()
    key = hashlib.sha256(key_preimage(run, step, kind, target, fp, payload_in_key)).hexdigest()
    v = {
        "name": name,
        "intent": {
            "run": run,
            "step": step,
            "kind": kind,
            "target": target,
            "payload": given,
            "payload_in_key": payload_in_key,
        },
        "tag": tag.decode(),
    }
    if tag == JSON_TAG:
        v["canonical"] = canonical.decode("utf-8")
    v["canonical_hex"] = canonical.hex()
    v["fingerprint"] = fp
    v["key"] = key
    return v


MAIL = '{ "to": "ada@example.com", "cc": [ "grace@example.com", "alan@example.com" ],\n  "meta": { "z": [ [ 2, 1 ], { "b": true, "a": null } ], "a": [] } }'
UNICODE = '{"\\ufb33": "\\u00fc\\u20ac\\ud83d\\ude00", "😀": "grinning face", "€": "euro sign", "ü": "u with diaeresis"}'
ESCAPES = '"\\u0000\\u001F\\t\\n\\"\\\\\\/<>&\\u007f\\u2028é"'
NUMBERS = "[1E+2, -0, 0.000001, 1e-7, 1e21, 999999999999999900000, 0.1, 4.50, 2e-3, 5e-324, 9007199254740992]"


def vectors():
    return [
        vector("no payload", "run-1", 0, "send_email", "ada@example.com"),
        vector("no payload, PayloadInKey", "run-1", 0, "send_email", "ada@example.com", payload_in_key=True),
        vector("JSON object: keys sorted at every level, arrays kept in order", "run-1", 2, "send_email", "ada@example.com", ("json", MAIL)),
        vector("the same JSON object, PayloadInKey: same fingerprint, another key", "run-1", 2, "send_email", "ada@example.com", ("json", MAIL), True),
        vector("the number 100", "invoice-17", 0, "charge_card", "cus_42", ("json", '{"amount": 100}')),
        vector("the number 100.0: the same fingerprint as 100", "invoice-17", 0, "charge_card", "cus_42", ("json", '{"amount": 100.0}')),
        vector("the number 1e2: the same fingerprint as 100", "invoice-17", 0, "charge_card", "cus_42", ("json", '{"amount": 1e2}')),
        vector("numbers in ECMAScript form", "run-1", 3, "record", "", ("json", NUMBERS)),
        vector("non-ASCII strings; keys in UTF-16 order, which is not UTF-8 order", "run-1", 4, "post_message", "#général", ("json", UNICODE)),
        vector("string escapes: only the required ones", "run-1", 5, "post_message", "#ops", ("json", ESCAPES)),
        vector('JSON string "hi"', "run-1", 6, "post_message", "#ops", ("json", '"hi"')),
        vector('raw bytes "hi" (with the quotes): the same bytes as JSON "hi", another fingerprint', "run-1", 6, "post_message", "#ops", ("raw", b'"hi"')),
        vector("raw bytes that are not UTF-8", "run-1", 7, "upload", "s3://bucket/object", ("raw", bytes([0x00, 0xFF, 0xFE, 0x80, 0x0A]))),
        vector("a larger step (decimal text), an empty target, a non-ASCII run", "ünïcødé-run", 12, "k", "", ("json", "null")),
    ]


# --- self-check against RFC 8785's own examples, and ECMAScript's numbers ------

APPENDIX_B = os.path.join(HERE, "..", "jcs", "rfc8785-numbers.txt")
ES_NUMBERS = os.path.join(HERE, "..", "jcs", "es-numbers.txt")
EXAMPLES = os.path.join(HERE, "..", "jcs", "rfc8785-examples.json")


def self_check():
    for path in (APPENDIX_B, ES_NUMBERS):
        check_numbers(path)
    with open(EXAMPLES, encoding="utf-8") as f:
        for ex in json.load(f):
            got = jcs(ex["input"].encode("utf-8"), strict=False)
            assert got == ex["output"].encode("utf-8"), (ex["name"], got)


def check_numbers(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            h, want = line.split(",", 1)
            x = struct.unpack(">d", bytes.fromhex(h.rjust(16, "0")))[0]
            if not want:
                assert math.isnan(x) or math.isinf(x), h
                continue
            got = es_number(x)
            assert got == want, (path, h, got, want)


def dump(vs):
    # Non-ASCII as itself, for reading; DEL and U+2028 escaped, so that no
    # invisible character sits in the file or in KEYS.md.
    s = json.dumps({"vectors": vs}, ensure_ascii=False, indent=2)
    return s.replace("\x7f", "\\u007f").replace("\u2028", "\\u2028") + "\n"


def preimage_text(fields):
    """One line a field: its length and its bytes in hexadecimal, then what
    it is. The Go tests read the first two columns back."""
    rows = []
    for b, what in fields:
        data = b.hex()
        rows.append((struct.pack(">Q", len(b)).hex(), data, what))
    width = max(len(d) for _, d, _ in rows)
    return "".join("%s %s  %s\n" % (n, d.ljust(width), what) for n, d, what in rows)


def worked_example():
    """The preimages of the vector "the number 100", for KEYS.md."""
    v = [v for v in vectors() if v["name"] == "the number 100"][0]
    i = v["intent"]
    canonical = bytes.fromhex(v["canonical_hex"])
    fp = preimage_text([
        (PAYLOAD_DOMAIN, '"once.payload.v2"'),
        (JSON_TAG, '"json"'),
        (canonical, canonical.decode()),
    ])
    key = preimage_text([
        (KEY_DOMAIN, '"once.key.v2"'),
        (i["run"].encode(), "run " + json.dumps(i["run"])),
        (str(i["step"]).encode(), 'step "%d"' % i["step"]),
        (i["kind"].encode(), "kind " + json.dumps(i["kind"])),
        (i["target"].encode(), "target " + json.dumps(i["target"])),
        (b"", "PayloadInKey is false: empty"),
    ])
    return fp, key


def keys_md(vectors_json):
    """KEYS.md as it should be: its generated parts replaced."""
    with open(KEYS_MD, encoding="utf-8") as f:
        md = f.read()
    i, j = md.index(BEGIN) + len(BEGIN), md.index(END)
    md = md[:i] + "\n```json\n" + vectors_json + "```\n" + md[j:]
    for marker, text in zip(("<!-- preimage:fingerprint -->", "<!-- preimage:key -->"), worked_example()):
        i = md.index(marker) + len(marker)
        j = md.index("```\n", md.index("```text\n", i) + len("```text\n")) + len("```\n")
        md = md[:i] + "\n```text\n" + text + "```\n" + md[j:]
    return md


def main():
    self_check()
    out = dump(vectors())
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--write":
        with open(VECTORS, "w", encoding="utf-8") as f:
            f.write(out)
        md = keys_md(out)
        with open(KEYS_MD, "w", encoding="utf-8") as f:
            f.write(md)
    elif mode == "--check":
        with open(VECTORS, encoding="utf-8") as f:
            if f.read() != out:
                sys.exit("vectors.json differs from what the spec gives")
        with open(KEYS_MD, encoding="utf-8") as f:
            if f.read() != keys_md(out):
                sys.exit("KEYS.md's vectors or worked example differ from what the spec gives")
        print("vectors.json and KEYS.md agree with the spec")
    else:
        sys.stdout.write(out)


if __name__ == "__main__":
    main()
