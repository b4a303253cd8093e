"""Keys and fingerprints of intents, as KEYS.md specifies them, with RFC
8785's canonical JSON: the client computes them to check the server's, so
that a canonical form that drifted between the two is caught at the first
claim (the server refuses a key it did not compute: key_mismatch).

Standard library only. testdata/keys/keyvectors.py, which makes the test
vectors, uses this module; nothing here is shared with the Go code.
"""

import decimal
import hashlib
import json
import math
import struct

KEY_DOMAIN = b"once.key.v2"
PAYLOAD_DOMAIN = b"once.payload.v2"
RAW_TAG = b"raw"
JSON_TAG = b"json"


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




def fingerprint_of(tag, canonical):
    """The fingerprint of a payload: tag is RAW_TAG or JSON_TAG."""
    return hashlib.sha256(payload_preimage(tag, canonical)).hexdigest()


class _JSONNull:
    """The JSON value null as a payload: None is no payload."""

    def __repr__(self):
        return "JSON_NULL"


JSON_NULL = _JSONNull()


def key_of(run, step, kind, target="", payload=None, payload_in_key=False, raw=None):
    """The (key, fingerprint) of an intent. payload is a JSON value (a
    dict, a list, a str, a number..., JSON_NULL for null), encoded with
    json.dumps and hashed in its canonical form; raw, bytes hashed as they
    are. At most one of the two; neither is no payload."""
    if payload is not None and raw is not None:
        raise ValueError("give payload (JSON) or raw (bytes), not both")
    if raw is not None:
        tag, canonical = RAW_TAG, bytes(raw)
    elif payload is None:
        tag, canonical = RAW_TAG, b""
    else:
        tag, canonical = JSON_TAG, jcs(payload_json(payload))
    fp = fingerprint_of(tag, canonical)
    key = hashlib.sha256(key_preimage(run, step, kind, target, fp, payload_in_key)).hexdigest()
    return key, fp


class NotJSON(Refused):
    """A value that is not JSON, or whose JSON another language would read
    otherwise: path names where (payload.items[2], result["id"]), reason
    what. Nothing was sent for it."""

    def __init__(self, path, reason):
        super().__init__("%s: %s" % (path, reason))
        self.path, self.reason = path, reason


# JSON numbers are exact in every language (JavaScript's included) up to
# 2**53; beyond, only those whose canonical form is themselves: another
# would hash as another number (the server refuses it too).
_EXACT = 2 ** 53


def _exact_double(n):
    """Whether n's canonical form (the shortest double's, RFC 8785) is n."""
    try:
        canonical_number(str(n), True)
        return True
    except (Refused, OverflowError):
        return False


def check_json(v, path="payload", exact_ints=True):
    """Raise NotJSON, naming the path, for a part of v that is not JSON or
    whose JSON differs between languages: a NaN or infinite float, a
    dict key that is not a str, bytes, a set, a circular reference, an
    object json cannot encode; with exact_ints, an int beyond 2**53 whose
    canonical form is another number (JavaScript would read that one).
    Lists and tuples are JSON arrays (a tuple comes back as a list)."""
    stack = set()

    def walk(v, path):
        if v is None or v is True or v is False or isinstance(v, str):
            return
        if isinstance(v, int):
            if exact_ints and not -_EXACT <= v <= _EXACT and not _exact_double(v):
                raise NotJSON(path, "int %d is beyond 2**53, and its canonical JSON is another number: other languages would read that" % v)
            return
        if isinstance(v, float):
            if math.isnan(v) or math.isinf(v):
                raise NotJSON(path, "float %r is not JSON" % v)
            return
        if isinstance(v, (dict, list, tuple)):
            if id(v) in stack:
                raise NotJSON(path, "a circular reference is not JSON")
            stack.add(id(v))
            if isinstance(v, dict):
                for k, e in v.items():
                    if not isinstance(k, str):
                        raise NotJSON("%s[%r]" % (path, k), "a dict key of type %s is not JSON: keys are str" % type(k).__name__)
                    walk(e, "%s[%s]" % (path, json.dumps(k, ensure_ascii=False)) if not k.isidentifier() else path + "." + k)
            else:
                for i, e in enumerate(v):
                    walk(e, "%s[%d]" % (path, i))
            stack.discard(id(v))
            return
        raise NotJSON(path, "%s is not JSON" % type(v).__name__)

    walk(v, path)


def payload_json(payload, path="payload", exact_ints=True):
    """payload as JSON text (bytes), as it is sent; NotJSON, naming the
    path, for a part that is not JSON (check_json)."""
    if payload is JSON_NULL:
        return b"null"
    check_json(payload, path, exact_ints)
    return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
