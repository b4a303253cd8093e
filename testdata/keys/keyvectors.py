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

import hashlib
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))

from once_client.keys import (  # noqa: E402
    JSON_TAG,
    KEY_DOMAIN,
    PAYLOAD_DOMAIN,
    RAW_TAG,
    Refused,
    canonical_number,
    es_number,
    jcs,
    key_preimage,
    payload_preimage,
)

VECTORS = os.path.join(HERE, "vectors.json")
KEYS_MD = os.path.join(HERE, "..", "..", "KEYS.md")
BEGIN = "<!-- vectors:begin -->"
END = "<!-- vectors:end -->"


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
