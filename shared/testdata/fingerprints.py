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
import re
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


# --- A route's fingerprint rule (idem_core::FingerprintRule) -------------------------
# Only some of a JSON body (RFC 6901 pointers kept, "only", or left out, "except"), and
# some headers. Tag "idem/fingerprint/v1/selected"; parts: method, path+query ("/" when
# empty), media type, body tag, the selection, the rule, the headers. The selection of
# a JSON body: "except" -> the canonical document without the members and elements the
# pointers name in the document as sent; "only" -> [[pointer, value] or [pointer] when
# absent, ...], or the canonical document when every pointer is absent; neither -> the
# canonical document. A body that is not JSON is hashed raw. The rule:
# [mode, [pointers], [header names]]. The headers: [[name, values joined by ", " or
# null], ...] in the rule's order.

MISSING = object()


def pointer_tokens(pointer):
    """RFC 6901 §4: split on "/", then ~1 -> "/" and only then ~0 -> "~"."""
    assert pointer.startswith("/"), pointer
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(token, items):
    if re.fullmatch(r"0|[1-9][0-9]*", token) and int(token) < len(items):
        return int(token)
    return None


def _get(value, tokens):
    for token in tokens:
        if isinstance(value, dict):
            if token not in value:
                return MISSING
            value = value[token]
        elif isinstance(value, list):
            i = _index(token, value)
            if i is None:
                return MISSING
            value = value[i]
        else:
            return MISSING
    return value


def _path(doc, tokens):
    """The pointer's place in the document as sent: its keys and indices, or None."""
    path, value = [], doc
    for token in tokens:
        if isinstance(value, dict) and token in value:
            path.append(("key", token))
            value = value[token]
        elif isinstance(value, list) and _index(token, value) is not None:
            i = _index(token, value)
            path.append(("index", i))
            value = value[i]
        else:
            return None
    return tuple(path) or None


def _without(value, removed, at=()):
    """The value without the places in `removed` (each resolved in the original)."""
    if isinstance(value, dict):
        return {k: _without(v, removed, at + (("key", k),))
                for k, v in value.items() if at + (("key", k),) not in removed}
    if isinstance(value, list):
        return [_without(v, removed, at + (("index", i),))
                for i, v in enumerate(value) if at + (("index", i),) not in removed]
    return value


def selected_fingerprint(method, path, content_type, body, only, except_, rule_headers, headers):
    essence = media_type(content_type)
    canon = canonical_json(body) if is_json(essence) else None
    if canon is None:
        tag, selection = b"raw", body
    else:
        doc = json.loads(canon.decode(), object_pairs_hook=_pairs, parse_int=RawNumber,
                         parse_float=RawNumber, parse_constant=_reject_constant)
        tag = b"json"
        if only:
            picked = []
            for p in only:
                v = _get(doc, pointer_tokens(p))
                picked.append([p] if v is MISSING else [p, v])
            if all(len(pair) == 1 for pair in picked):
                selection = canon  # no kept field: the whole body
            else:
                selection = _canon(picked, 0).encode()
        else:
            removed = {_path(doc, pointer_tokens(p)) for p in except_} - {None}
            selection = _canon(_without(doc, removed), 0).encode()
    mode = "only" if only else "except" if except_ else "whole"
    rule = _canon([mode, list(only or except_), list(rule_headers)], 0).encode()
    values = []
    for name in rule_headers:
        sent = [v for n, v in headers if n.lower() == name]
        values.append([name, ", ".join(sent) if sent else None])
    header_part = _canon(values, 0).encode()
    h = hashlib.sha256()
    for part in [b"idem/fingerprint/v1/selected", method.encode(), (path or "/").encode(),
                 essence, tag, selection, rule, header_part]:
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


TIMED = b'{"amount":1000,"currency":"usd","sent_at":"2026-12-05T10:00:00Z","meta":{"trace":"t1","v":2}}'
SELECTED = [
    # (name, path, content type, body, only, except, rule headers, request headers)
    ("except sent_at", "/v1/charges", J, TIMED, [], ["/sent_at"], [], []),
    ("except sent_at, another sent_at", "/v1/charges", J,
     b'{"sent_at":"2026-12-05T10:00:09Z","currency":"usd","amount":1000,"meta":{"v":2,"trace":"t1"}}',
     [], ["/sent_at"], [], []),
    ("except sent_at, another amount", "/v1/charges", J, TIMED.replace(b"1000", b"1001"), [], ["/sent_at"], [], []),
    ("except sent_at, without it", "/v1/charges", J, b'{"amount":1000,"currency":"usd","meta":{"trace":"t1","v":2}}',
     [], ["/sent_at"], [], []),
    ("except a nested field", "/v1/charges", J, TIMED, [], ["/sent_at", "/meta/trace"], [], []),
    ("except an array element", "/v1/orders", J, b'{"items":[{"id":1},{"id":2},{"id":3}]}', [], ["/items/0"], [], []),
    ("except a field of an element", "/v1/orders", J, b'{"items":[{"id":1,"ts":5},{"id":2,"ts":6}]}',
     [], ["/items/1/ts"], [], []),
    ("except a leading-zero index: nothing", "/v1/orders", J, b'{"items":[1,2]}', [], ["/items/01"], [], []),
    ("except an index past the end: nothing", "/v1/orders", J, b'{"items":[1,2]}', [], ["/items/2"], [], []),
    ("except escaped tokens", "/v1/notes", J, b'{"a/b":1,"m~n":2,"k":3}', [], ["/a~1b", "/m~0n"], [], []),
    ("except the empty key", "/v1/notes", J, b'{"":1,"k":3}', [], ["/"], [], []),
    ("except a unicode key", "/v1/notes", J, '{"caf\u00e9":1,"k":3}'.encode(), [], ["/café"], [], []),
    ("except into a scalar: nothing", "/v1/charges", J, TIMED, [], ["/amount/x"], [], []),
    ("except a pointer twice: one element", "/v1/orders", J, b'{"items":[1,2,3]}', [], ["/items/0", "/items/0"], [], []),
    ("except two elements, as sent", "/v1/orders", J, b'{"items":["A","B","C"]}', [], ["/items/0", "/items/1"], [], []),
    ("except two elements, as sent, another third", "/v1/orders", J, b'{"items":["A","B","D"]}', [], ["/items/0", "/items/1"], [], []),
    ("except a member and what is in it", "/v1/charges", J, TIMED, [], ["/meta/trace", "/meta"], [], []),
    ("only amount and currency", "/v1/charges", J, TIMED, ["/amount", "/currency"], [], [], []),
    ("only, reordered", "/v1/charges", J, TIMED, ["/currency", "/amount"], [], [], []),
    ("only, a field absent", "/v1/charges", J, b'{"amount":1000}', ["/amount", "/currency"], [], [], []),
    ("only, a field null", "/v1/charges", J, b'{"amount":1000,"currency":null}', ["/amount", "/currency"], [], [], []),
    ("only, an object", "/v1/charges", J, TIMED, ["/meta"], [], [], []),
    ("only, through an array", "/v1/orders", J, b'{"items":[{"id":1},{"id":2}]}', ["/items/1/id"], [], [], []),
    ("only, every field absent: the whole body", "/v1/charges", J, b'{"charge":{"amount":5}}', ["/amount"], [], [], []),
    ("only, every field absent, another body", "/v1/charges", J, b'{"charge":{"amount":9000}}', ["/amount"], [], [], []),
    ("a header", "/v1/charges", J, TIMED, [], ["/sent_at"], ["x-tenant"], [("X-Tenant", "acme")]),
    ("a header repeated", "/v1/charges", J, TIMED, [], ["/sent_at"], ["x-tenant"], [("x-tenant", "acme"), ("x-tenant", "b")]),
    ("a header folded", "/v1/charges", J, TIMED, [], ["/sent_at"], ["x-tenant"], [("x-tenant", "acme, b")]),
    ("a header absent", "/v1/charges", J, TIMED, [], ["/sent_at"], ["x-tenant"], []),
    ("a header empty", "/v1/charges", J, TIMED, [], ["/sent_at"], ["x-tenant"], [("x-tenant", "")]),
    ("a header, whole body", "/v1/charges", J, TIMED, [], [], ["x-tenant", "x-region"], [("x-region", "eu \"1\"")]),
    ("a body that is not json", "/v1/charges", "application/x-www-form-urlencoded", b"amount=1&sent_at=2", [], ["/sent_at"], [], []),
    ("invalid json", "/v1/charges", J, b'{"sent_at":1,', [], ["/sent_at"], [], []),
    ("no content type", "", None, b"", [], ["/sent_at"], [], []),
    ("vendor json, whitespace", "/v1/events", "Application/Vnd.Api+JSON; charset=utf-8", b' { "sent_at" : 1 , "a" : [ 1 , 2 ] } ', [], ["/sent_at"], [], []),
]


def selected_vectors():
    out = []
    for name, path, ct, body, only, except_, rule_headers, headers in SELECTED:
        out.append({
            "name": name, "method": "POST", "path_and_query": path, "content_type": ct,
            "body_hex": body.hex(), "only": only, "except": except_,
            "rule_headers": rule_headers, "headers": [list(h) for h in headers],
            "fingerprint": selected_fingerprint("POST", path, ct, body, only, except_, rule_headers, headers),
        })
    return out


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
    text = json.dumps({"version": 1, "vectors": vectors(), "selected": selected_vectors()}, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(path) as f:
            if f.read() != text:
                sys.exit(f"{path} does not match the Python reference implementation; rerun without --check")
        print(f"fingerprint vectors: {len(CASES)} whole and {len(SELECTED)} selected agree with the Python reference")
        return
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {len(CASES)} + {len(SELECTED)} vectors to {path}")


if __name__ == "__main__":
    main()
