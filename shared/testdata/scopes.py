#!/usr/bin/env python3
"""An independent implementation of idem's request scope (v1), and its test vectors.

    python3 scopes.py          # rewrite scope-vectors.json
    python3 scopes.py --check  # fail unless the checked-in file matches

The Rust core checks the same file on the host and in WASM, so the origin's layer and
the edge's worker must name the same record for every request here.

scope = SHA-256( u64be(len(tag)) tag, then for each part u64be(len) part ), with
  authorization: tag "idem/scope/credential/v1", part: the bearer token (or the whole
                 Authorization value);
  header:<name>: tag "idem/scope/header/v1", parts: the lower-case name, the value;
  jwt:<claim>:   tag "idem/scope/jwt-claim/v1", parts: the claim, the canonical JSON of
                 its value in the payload of an HS256 JWT whose signature, exp and nbf hold;
  anonymous:     tag "idem/scope/anonymous/v1", no parts.
"""

import base64
import hashlib
import hmac
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fingerprints import RawNumber, canonical_json  # noqa: E402  the same canonical JSON

SECRET = b"a secret of the gateway"
NOW = 1_800_000_000


def tagged(tag, parts):
    h = hashlib.sha256()
    h.update(len(tag).to_bytes(8, "big") + tag)
    for p in parts:
        h.update(len(p).to_bytes(8, "big") + p)
    return h.hexdigest()


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(payload, secret=SECRET, header=b'{"alg":"HS256","typ":"JWT"}'):
    signed = b64(header) + "." + b64(payload.encode())
    sig = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return signed + "." + b64(sig)


def unb64(s):
    if "=" in s or len(s) % 4 == 1:
        raise ValueError("padding")
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if b64(raw) != s:
        raise ValueError("stray bits")
    return raw


def strict_json(raw):
    """The value, numbers kept as written; None unless it is valid JSON without
    duplicate keys (what the canonical form accepts)."""
    if canonical_json(raw) is None:
        return None
    return json.loads(raw, parse_int=RawNumber, parse_float=RawNumber)


def claim_value(token, claim, secret):
    """The canonical bytes of the claim, or None when the token is not accepted."""
    try:
        head, body, sig = token.split(".")
        header = strict_json(unb64(head))
        if not isinstance(header, dict) or header.get("alg") != "HS256":
            return None
        expected = hmac.new(secret, (head + "." + body).encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(unb64(sig), expected):
            return None
        raw = unb64(body)
        payload = strict_json(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    for name, late in (("exp", False), ("nbf", True)):
        if name in payload:
            v = payload[name]
            # Whole seconds of a number as written; no sign, no exponent.
            if not isinstance(v, RawNumber) or any(c in v for c in "eE-"):
                return None
            whole = int(v.split(".")[0])
            if (whole > NOW) if late else (whole <= NOW):
                return None
    v = payload.get(claim)
    names_someone = (isinstance(v, str) and not isinstance(v, RawNumber) and v != "") or (
        isinstance(v, RawNumber) and v.lstrip("-").isdigit())
    if not names_someone:
        return None
    if isinstance(v, RawNumber):
        return v.encode()
    return canonical_json(json.dumps(v).encode())


def scope(source, anonymous, headers):
    """The scope's hex, or the problem: identity-missing | identity-invalid."""
    def missing():
        return tagged(b"idem/scope/anonymous/v1", []) if anonymous == "scoped" else "identity-missing"

    if source == "authorization":
        v = headers.get("authorization")
        if isinstance(v, list):
            v = v[0] if v else None
        if v is None:
            return missing()
        raw = v.encode()
        cred = raw[7:].strip() if raw[:7].lower() == b"bearer " else raw
        return tagged(b"idem/scope/credential/v1", [cred])
    def single(name):
        v = headers.get(name)
        if isinstance(v, list):
            return "identity-invalid" if len(v) > 1 else (v[0] if v else None)
        if v is not None and "," in v:
            return "identity-invalid"
        return v

    if source.startswith("header:"):
        name = source[len("header:"):].lower()
        v = single(name)
        if v == "identity-invalid":
            return v
        v = (v or "").strip()
        if not v:
            return missing()
        return tagged(b"idem/scope/header/v1", [name.encode(), v.encode()])
    claim = source[len("jwt:"):]
    v = single("authorization")
    if v == "identity-invalid":
        return v
    if v is None:
        return missing()
    if v[:7].lower() != "bearer ":
        return "identity-invalid"
    value = claim_value(v[7:].strip(), claim, SECRET)
    if value is None:
        return "identity-invalid"
    return tagged(b"idem/scope/jwt-claim/v1", [claim.encode(), value])


def cases():
    t1 = sign('{"sub":"cus_1","exp":1900000000,"iat":1}')
    refreshed = sign('{"iat":2, "sub":"cus_1", "exp":1900000500}')
    numeric = sign('{"sub":42,"exp":1900000000}')
    return [
        ("no identity, scoped", "authorization", "scoped", {}),
        ("no identity, refused", "authorization", "refused", {}),
        ("bearer token", "authorization", "scoped", {"authorization": "Bearer sk_live_1"}),
        ("bearer, scheme in capitals", "authorization", "scoped", {"authorization": "BEARER sk_live_1"}),
        ("another scheme, whole value", "authorization", "scoped", {"authorization": "Basic dTpw"}),
        ("api key header", "header:x-api-key", "refused", {"x-api-key": "key-a"}),
        ("api key header, padded", "header:x-api-key", "refused", {"x-api-key": "  key-a "}),
        ("api key missing, refused", "header:x-api-key", "refused", {"authorization": "Bearer x"}),
        ("api key blank, scoped", "header:x-api-key", "scoped", {"x-api-key": " "}),
        ("jwt sub", "jwt:sub", "refused", {"authorization": "Bearer " + t1}),
        ("jwt sub, refreshed token", "jwt:sub", "refused", {"authorization": "Bearer " + refreshed}),
        ("jwt numeric sub", "jwt:sub", "refused", {"authorization": "Bearer " + numeric}),
        ("jwt other claim", "jwt:iat", "refused", {"authorization": "Bearer " + t1}),
        ("jwt expired", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":1800000000}')}),
        ("jwt not yet valid", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","nbf":1800000001}')}),
        ("jwt wrong key", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', b"another key")}),
        ("jwt alg none", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"none"}').rsplit(".", 1)[0] + "."}),
        ("jwt without the claim", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"name":"u"}')}),
        ("jwt not a token", "jwt:sub", "scoped", {"authorization": "Bearer abc.def"}),
        ("jwt basic scheme", "jwt:sub", "scoped", {"authorization": "Basic dTpw"}),
        ("jwt missing, scoped", "jwt:sub", "scoped", {}),
        ("jwt missing, refused", "jwt:sub", "refused", {}),
        ("jwt alg none, signature valid", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"none"}')}),
        ("jwt alg hs256", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"hs256"}')}),
        ("jwt alg escaped", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"HS\\u0032\\u0035\\u0036"}')}),
        ("jwt header with two algs", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"HS256","alg":"none"}')}),
        ("jwt empty sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":""}')}),
        ("jwt boolean sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":false}')}),
        ("jwt fractional sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":1.50}')}),
        ("jwt string 42", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"42"}')}),
        ("jwt number 42", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":42}')}),
        ("jwt escaped sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"\\u0063us_1","exp":1900000000}')}),
        ("jwt duplicate sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"a","sub":"b"}')}),
        ("jwt exp with exponent", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":1e10}')}),
        ("jwt nbf with exponent", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","nbf":1.9e9}')}),
        ("jwt fractional exp", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":1800000000.5}')}),
        ("jwt sent twice", "jwt:sub", "scoped", {"authorization": ["Bearer " + t1, "Bearer " + t1]}),
        ("api key sent twice", "header:x-api-key", "scoped", {"x-api-key": ["key-a", "key-b"]}),
        ("api key joined by a runtime", "header:x-api-key", "scoped", {"x-api-key": "key-a, key-b"}),
        ("authorization sent twice, first wins", "authorization", "scoped", {"authorization": ["Bearer sk_live_1", "Bearer other"]}),
    ]


def vectors():
    return [
        {
            "name": name,
            "scope_from": source,
            "anonymous": anonymous,
            "headers": headers,
            "expect": scope(source, anonymous, headers),
        }
        for name, source, anonymous, headers in cases()
    ]


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scope-vectors.json")
    doc = {"version": 1, "secret": SECRET.decode(), "now": NOW, "vectors": vectors()}
    text = json.dumps(doc, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(path) as f:
            if f.read() != text:
                sys.exit(f"{path} does not match the Python reference implementation; rerun without --check")
        print(f"scope vectors: {len(doc['vectors'])} agree with the Python reference")
        return
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {len(doc['vectors'])} vectors to {path}")


if __name__ == "__main__":
    main()
