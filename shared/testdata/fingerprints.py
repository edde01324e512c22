#!/usr/bin/env python3
"""An independent implementation of idem's request fingerprint (v1), and its test vectors.

    python3 fingerprints.py          # rewrite fingerprint-vectors.json
    python3 fingerprints.py --check  # fail unless the checked-in file matches

The Rust core (host and wasm32) checks the same file, so three implementations —
this one, the origin's and the edge's — must agree byte for byte.

Fingerprint = SHA-256( u64be(len(tag)) tag, then for each part u64be(len) part )
with tag "idem/fingerprint/v1" and parts: method, path+query, media type (lower-case,
parameters dropped), body tag ("json" | "raw"), body (canonical JSON or raw bytes).
"""
import hashlib
import json
import os
import sys

MAX_DEPTH = 128


class Invalid(Exception):
    pass


class RawNumber(str):
    """A JSON number kept exactly as written."""


def _reject_constant(name):
    raise Invalid(name)


def _pairs(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Invalid("duplicate key")
    return dict(pairs)


def _string(s):
    try:
        s.encode("utf-8")  # lone surrogates from \ud800-style escapes fail here
    except UnicodeEncodeError:
        raise Invalid("lone surrogate")
    out = ['"']
    short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    for ch in s:
        if ch in short:
            out.append(short[ch])
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _canon(v, depth):
    if isinstance(v, dict):
        if depth + 1 > MAX_DEPTH:
            raise Invalid("too deep")
        items = sorted(v.items(), key=lambda kv: kv[0].encode("utf-8", "surrogatepass"))
        return "{" + ",".join(_string(k) + ":" + _canon(x, depth + 1) for k, x in items) + "}"
    if isinstance(v, list):
        if depth + 1 > MAX_DEPTH:
            raise Invalid("too deep")
        return "[" + ",".join(_canon(x, depth + 1) for x in v) + "]"
    if isinstance(v, RawNumber):
        return str(v)
    if isinstance(v, str):
        return _string(v)
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    raise Invalid(repr(v))


def canonical_json(body: bytes):
    """Canonical bytes, or None when the body is not valid JSON."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_pairs, parse_int=RawNumber,
                           parse_float=RawNumber, parse_constant=_reject_constant)
        return _canon(value, 0).encode("utf-8")
    except (Invalid, ValueError, RecursionError):
        return None


def media_type(content_type):
    if content_type is None:
        return b""
    return content_type.split(";")[0].strip(" \t").lower().encode()


def is_json(essence: bytes):
    return essence == b"application/json" or (essence.endswith(b"+json") and b"/" in essence)


def fingerprint(method, path, content_type, body):
    essence = media_type(content_type)
    canon = canonical_json(body) if is_json(essence) else None
    tag, data = (b"json", canon) if canon is not None else (b"raw", body)
    h = hashlib.sha256()
    for part in [b"idem/fingerprint/v1", method.encode(), path.encode(), essence, tag, data]:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


J = "application/json"
CHARGE = b'{"amount":1000,"currency":"usd","customer":"cus_1"}'
CASES = [
    ("charge", "POST", "/v1/charges", J, CHARGE),
    ("charge reordered keys", "POST", "/v1/charges", J, b'{"customer":"cus_1","currency":"usd","amount":1000}'),
    ("charge with whitespace", "POST", "/v1/charges", J, b' {\n  "amount" : 1000,\n\t"currency": "usd",\r\n "customer":"cus_1" }\n'),
    ("charge content-type params and case", "POST", "/v1/charges", "Application/JSON ; charset=UTF-8", CHARGE),
    ("charge different amount", "POST", "/v1/charges", J, b'{"amount":1001,"currency":"usd","customer":"cus_1"}'),
    ("charge with query", "POST", "/v1/charges?expand=customer", J, CHARGE),
    ("charge query order matters", "POST", "/v1/charges?b=2&a=1", J, CHARGE),
    ("charge as PATCH", "PATCH", "/v1/charges", J, CHARGE),
    ("nested objects reordered", "POST", "/v1/orders", J, b'{"b":{"y":[3,2,1],"x":{"q":null,"p":true}},"a":false}'),
    ("unicode raw", "POST", "/v1/notes", J, '{"text":"caf\u00e9 \u65e5\u672c \U0001F600"}'.encode()),
    ("unicode escaped equals raw", "POST", "/v1/notes", J, b'{"text":"caf\\u00e9 \\u65e5\\u672c \\ud83d\\ude00"}'),
    ("escapes normalised", "POST", "/v1/notes", J, b'{"s":"\\/ \\u0041 \\u0009 \\u001f \\\\ \\""}'),
    ("keys sorted by code point", "POST", "/v1/notes", J, '{"\u00e9":1,"z":2,"A":3,"a":4,"\U0001F600":5}'.encode()),
    ("numbers kept verbatim", "POST", "/v1/numbers", J, b'[1, 1.0, -0, 1e2, 1E+2, 0.5e-3, 12345678901234567890123]'),
    ("empty body no content type", "POST", "/v1/ping", None, b""),
    ("empty body json content type", "POST", "/v1/ping", J, b""),
    ("empty object", "POST", "/v1/ping", J, b"{}"),
    ("invalid json hashed raw", "POST", "/v1/charges", J, b'{"amount":1000,'),
    ("duplicate keys hashed raw", "POST", "/v1/charges", J, b'{"a":1,"a":2}'),
    ("lone surrogate hashed raw", "POST", "/v1/notes", J, b'{"s":"\\ud800"}'),
    ("binary body", "POST", "/v1/upload", "application/octet-stream", bytes(range(256))),
    ("binary body in json content type", "POST", "/v1/upload", J, b"\xff\xfe\x00\x01"),
    ("form body exact", "POST", "/v1/charges", "application/x-www-form-urlencoded", b"amount=1000&currency=usd"),
    ("text body whitespace matters", "POST", "/v1/notes", "text/plain", b' {"a": 1} '),
    ("vendor json type", "POST", "/v1/events", "application/vnd.api+json", b'{ "b":1, "a":2 }'),
    ("too deep hashed raw", "POST", "/v1/deep", J, b"[" * 129 + b"]" * 129),
    ("deepest canonical", "POST", "/v1/deep", J, b"[ " * 128 + b"]" * 128),
]


def vectors():
    out = []
    for name, method, path, ct, body in CASES:
        canon = canonical_json(body) if is_json(media_type(ct)) else None
        out.append({
            "name": name, "method": method, "path_and_query": path, "content_type": ct,
            "body_hex": body.hex(), "json_canonical": canon is not None,
            "fingerprint": fingerprint(method, path, ct, body),
        })
    return out


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fingerprint-vectors.json")
    text = json.dumps({"version": 1, "vectors": vectors()}, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(path) as f:
            if f.read() != text:
                sys.exit(f"{path} does not match the Python reference implementation; rerun without --check")
        print(f"fingerprint vectors: {len(CASES)} agree with the Python reference")
        return
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {len(CASES)} vectors to {path}")


if __name__ == "__main__":
    main()
