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
from fingerprints import canonical_json  # noqa: E402  the same canonical JSON

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


def claim_value(token, claim, secret):
    """The canonical bytes of the claim, or None when the token is not accepted."""
    try:
        head, body, sig = token.split(".")
        header = json.loads(unb64(head))
        if header.get("alg") != "HS256":
            return None
        expected = hmac.new(secret, (head + "." + body).encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(unb64(sig), expected):
            return None
        payload = json.loads(unb64(body))
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    for name, late in (("exp", False), ("nbf", True)):
        if name in payload:
            v = payload[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                return None
            if (int(v) > NOW) if late else (int(v) <= NOW):
                return None
    if payload.get(claim) is None:
        return None
    return canonical_json(json.dumps(payload[claim]).encode())


def scope(source, anonymous, headers):
    """The scope's hex, or the problem: identity-missing | identity-invalid."""
    def missing():
        return tagged(b"idem/scope/anonymous/v1", []) if anonymous == "scoped" else "identity-missing"

    if source == "authorization":
        v = headers.get("authorization")
        if v is None:
            return missing()
        raw = v.encode()
        cred = raw[7:].strip() if raw[:7].lower() == b"bearer " else raw
        return tagged(b"idem/scope/credential/v1", [cred])
    if source.startswith("header:"):
        name = source[len("header:"):].lower()
        v = (headers.get(name) or "").strip()
        if not v:
            return missing()
        return tagged(b"idem/scope/header/v1", [name.encode(), v.encode()])
    claim = source[len("jwt:"):]
    v = headers.get("authorization")
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
