#!/usr/bin/env python3
"""An independent implementation of idem's request scope (v1), and its test vectors.

    python3 scopes.py          # rewrite scope-vectors.json
    python3 scopes.py --check  # fail unless the checked-in file matches

The Rust core checks the same file on the host and in WASM, so the origin's layer and
the edge's worker must name the same record for every request here.

scope = SHA-256( u64be(len(tag)) tag, then for each part u64be(len) part ), with
  authorization: tag "idem/scope/credential/v1", part: the bearer token (or the whole
                 Authorization value: Basic credentials, or one word alone); a
                 registered scheme without a credential is no identity, and any
                 other scheme with parameters is refused (identity-invalid);
  header:<name>: tag "idem/scope/header/v1", parts: the lower-case name, the value;
  jwt:<claim>:   tag "idem/scope/jwt-claim/v1", parts: the claim, the canonical JSON of
                 its value in the payload of a JWT whose signature, exp and nbf hold
                 (exp required, unless the vector's keys say "hs256-exp-optional");
                 when the verifier pins no issuer (HS256 here) and the token has an
                 iss: tag "idem/scope/jwt-issuer-claim/v1", parts: the canonical JSON
                 of iss, the claim, the value:
                 HS256 with the secret, or RS256 / ES256 with a key of the JWKS (its
                 kid's, or the only one of its type; jws.py verifies them), the
                 token then naming the JWKS's issuer (iss) and audience (aud);
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
import jws  # noqa: E402

SECRET = b"a secret of the gateway, of 32 bytes at least"
# The IANA HTTP Authentication Scheme Registry: one of these alone is a scheme sent
# without its credential, not a credential.
REGISTERED_SCHEMES = (b"basic", b"bearer", b"concealed", b"digest", b"dpop", b"gnap", b"hoba", b"mutual",
                      b"negotiate", b"oauth", b"privatetoken", b"scram-sha-1", b"scram-sha-256", b"vapid")
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


# The JWKS: an RS256 key, an ES256 key, and the RSA key again marked for encryption
# (ignored: a JWKS may hold keys that are not for signatures).
RSA_N, RSA_E, RSA_D = jws.rsa_key(2048, "idem rsa-1")
EC_D, EC_Q = jws.ec_key("idem ec-1")


def unint(n, size=None):
    return b64(n.to_bytes(size or (n.bit_length() + 7) // 8, "big"))


ISSUER = "https://id.example"
AUDIENCE = "payments"

JWKS = {
    "keys": [
        {"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256", "n": unint(RSA_N), "e": unint(RSA_E)},
        {"kty": "EC", "kid": "ec-1", "crv": "P-256", "x": unint(EC_Q[0], 32), "y": unint(EC_Q[1], 32)},
        {"kty": "RSA", "kid": "enc-1", "use": "enc", "n": unint(RSA_N), "e": unint(RSA_E)},
    ]
}


def sign_jws(payload, alg, kid=None, seed="k"):
    """A JWT of `payload` signed with the JWKS's RSA (RS256) or EC (ES256) key."""
    header = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signed = (b64(json.dumps(header, separators=(",", ":")).encode()) + "." + b64(payload.encode())).encode()
    if alg == "RS256":
        sig = jws.rs256_sign(signed, RSA_N, RSA_D)
    else:
        sig = jws.es256_sign(signed, EC_D, seed)
    return signed.decode() + "." + b64(sig)


def verified(head, body, sig, header, keys):
    """Whether the signature holds under `keys`: ("hs256", secret) or ("jwks", doc)."""
    kind, material = keys
    alg = header.get("alg")
    signed = (head + "." + body).encode()
    if kind == "hs256":
        if alg != "HS256":
            return False
        expected = hmac.new(material, signed, hashlib.sha256).digest()
        return hmac.compare_digest(unb64(sig), expected)
    kty = {"RS256": "RSA", "ES256": "EC"}.get(alg)
    if kty is None:
        return False

    def usable(k):
        ops = k.get("key_ops", ["verify"])
        if k.get("use", "sig") != "sig" or not isinstance(ops, list) or "verify" not in ops:
            return False
        if k.get("kty") == "RSA":
            return k.get("alg", "RS256") == "RS256" and 2048 <= int.from_bytes(unb64(k["n"]), "big").bit_length() <= 4096
        return k.get("kty") == "EC" and k.get("crv") == "P-256" and k.get("alg", "ES256") == "ES256"

    keys_ = [k for k in material["keys"] if usable(k)]
    if "kid" in header:
        if not isinstance(header["kid"], str) or isinstance(header["kid"], RawNumber):
            return False
        named = [k for k in keys_ if k.get("kid") == header["kid"]]
        found = [k for k in named if k["kty"] == kty] or named[:1]
    else:
        found = [k for k in keys_ if k["kty"] == kty]
    if len(found) != 1 or found[0]["kty"] != kty:
        return False
    key, signature = found[0], unb64(sig)
    if kty == "RSA":
        n, e = (int.from_bytes(unb64(key[c]), "big") for c in ("n", "e"))
        return jws.rs256_verify(signed, signature, n, e)
    point = tuple(int.from_bytes(unb64(key[c]), "big") for c in ("x", "y"))
    return jws.es256_verify(signed, signature, point)


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


def names_issuer_and_audience(payload):
    """What a JWKS's tokens must also say: the issuer, and the audience (alone or in a
    list)."""
    iss, aud = payload.get("iss"), payload.get("aud")
    is_text = lambda v: isinstance(v, str) and not isinstance(v, RawNumber)  # noqa: E731
    if not (is_text(iss) and iss == ISSUER):
        return False
    if isinstance(aud, list):
        return any(is_text(a) and a == AUDIENCE for a in aud)
    return is_text(aud) and aud == AUDIENCE


def claim_value(token, claim, keys, exp_optional=False):
    """The canonical bytes of the claim, or None when the token is not accepted."""
    try:
        head, body, sig = token.split(".")
        header = strict_json(unb64(head))
        if not isinstance(header, dict) or "crit" in header or not verified(head, body, sig, header, keys):
            return None
        raw = unb64(body)
        payload = strict_json(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    # A token that never expires is refused, unless the verifier says exp is optional.
    if "exp" not in payload and not exp_optional:
        return None
    for name, late in (("exp", False), ("nbf", True)):
        if name in payload:
            v = payload[name]
            # Whole seconds of a number as written; no sign, no exponent, at most 19
            # digits (a u64's).
            if not isinstance(v, RawNumber) or any(c in v for c in "eE-") or len(v.split(".")[0]) > 19:
                return None
            whole = int(v.split(".")[0])
            if (whole > NOW) if late else (whole <= NOW):
                return None
    if keys[0] == "jwks" and not names_issuer_and_audience(payload):
        return None
    v = payload.get(claim)
    names_someone = (isinstance(v, str) and not isinstance(v, RawNumber) and v != "") or (
        isinstance(v, RawNumber) and v.lstrip("-").isdigit())
    if not names_someone:
        return None
    value = v.encode() if isinstance(v, RawNumber) else canonical_json(json.dumps(v).encode())
    # Unless the verifier pins an issuer (a JWKS's does), the token's iss is part of the
    # scope: two issuers' sub 42 are two callers.
    iss = payload.get("iss")
    if keys[0] == "jwks" or iss is None:
        return (None, value)
    issuer = iss.encode() if isinstance(iss, RawNumber) else canonical_json(json.dumps(iss).encode())
    return (issuer, value)


def scope(source, anonymous, headers, keys=("hs256", SECRET), exp_optional=False):
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
        if raw[:7].lower() == b"bearer ":
            cred = raw[7:].strip()
            return tagged(b"idem/scope/credential/v1", [cred]) if cred else missing()
        words = [w for w in raw.replace(b"\t", b" ").split(b" ") if w]
        if not words or (len(words) == 1 and words[0].lower() in REGISTERED_SCHEMES):
            return missing()
        if len(words) > 1 and words[0].lower() not in (b"bearer", b"basic"):
            # A signature scheme signs each attempt anew: every retry a new caller.
            return "identity-invalid"
        return tagged(b"idem/scope/credential/v1", [raw])
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
    found = claim_value(v[7:].strip(), claim, keys, exp_optional)
    if found is None:
        return "identity-invalid"
    issuer, value = found
    if issuer is None:
        return tagged(b"idem/scope/jwt-claim/v1", [claim.encode(), value])
    return tagged(b"idem/scope/jwt-issuer-claim/v1", [issuer, claim.encode(), value])


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
        # exp is required unless the verifier says otherwise (--jwt-require-exp false).
        ("jwt string 42, exp optional", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"42"}')},
         "hs256-exp-optional"),
        ("jwt number 42, exp optional", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":42}')},
         "hs256-exp-optional"),
        ("jwt without exp, exp optional, expired nbf rules", "jwt:sub", "scoped",
         {"authorization": "Bearer " + sign('{"sub":"u","nbf":1800000001}')}, "hs256-exp-optional"),
        # Without a pinned issuer, the token's iss is part of the scope.
        ("jwt sub of issuer a", "jwt:sub", "refused",
         {"authorization": "Bearer " + sign('{"sub":"cus_1","iss":"https://a.example","exp":1900000000}')}),
        ("jwt sub of issuer b", "jwt:sub", "refused",
         {"authorization": "Bearer " + sign('{"sub":"cus_1","iss":"https://b.example","exp":1900000000}')}),
        ("jwt escaped sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"\\u0063us_1","exp":1900000000}')}),
        ("jwt duplicate sub", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"a","sub":"b"}')}),
        ("jwt exp with exponent", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":1e10}')}),
        ("jwt nbf with exponent", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","nbf":1.9e9}')}),
        ("jwt fractional exp", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":1800000000.5}')}),
        ("jwt sent twice", "jwt:sub", "scoped", {"authorization": ["Bearer " + t1, "Bearer " + t1]}),
        ("api key sent twice", "header:x-api-key", "scoped", {"x-api-key": ["key-a", "key-b"]}),
        ("api key joined by a runtime", "header:x-api-key", "scoped", {"x-api-key": "key-a, key-b"}),
        ("authorization sent twice, first wins", "authorization", "scoped", {"authorization": ["Bearer sk_live_1", "Bearer other"]}),
        ("aws sigv4, refused", "authorization", "scoped", {"authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/eu-west-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date, Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"}),
        ("digest, refused", "authorization", "refused", {"authorization": 'Digest username="u", realm="r", nonce="n1", uri="/v1/charges", response="6629fae49393a05397450978507c4ef1"'}),
        ("another scheme with a token, refused", "authorization", "scoped", {"authorization": "Token sk_live_1"}),
        ("one word alone, whole value", "authorization", "refused", {"authorization": "sk_live_1"}),
        ("empty bearer, no identity", "authorization", "refused", {"authorization": "Bearer "}),
        ("bearer without a token, scoped", "authorization", "scoped", {"authorization": "Bearer"}),
        ("basic without credentials, no identity", "authorization", "refused", {"authorization": "Basic"}),
        ("blank authorization, no identity", "authorization", "refused", {"authorization": " "}),
        ("bearer after a tab, whole value", "authorization", "refused", {"authorization": "Bearer\tsk_live_1"}),
        ("a registered scheme alone, no identity", "authorization", "refused", {"authorization": "Negotiate"}),
        ("dpop alone, scoped", "authorization", "scoped", {"authorization": "DPoP"}),
        ("jwt exp of 20 digits", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u","exp":99999999999999999999}')}),
        ("jwt with crit", "jwt:sub", "scoped", {"authorization": "Bearer " + sign('{"sub":"u"}', header=b'{"alg":"HS256","crit":["b64"],"b64":false}')}),
    ] + jwks_cases()


def jwks_cases():
    """(name, source, anonymous, headers, "jwks"): tokens checked against the JWKS."""
    sub = '{"sub":"cus_1","iss":"https://id.example","aud":"payments","exp":1900000000,"iat":1}'
    claims = lambda extra: '{"sub":"cus_1","exp":1900000000' + extra + "}"  # noqa: E731
    bearer = lambda token: {"authorization": "Bearer " + token}  # noqa: E731
    rs = sign_jws(sub, "RS256", "rsa-1")
    es = sign_jws(sub, "ES256", "ec-1")
    head, body, sig = es.split(".")
    r, s_ = unb64(sig)[:32], unb64(sig)[32:]
    der = lambda i: b"\x02" + bytes([len(i.lstrip(b"\x00")) + 1]) + b"\x00" + i.lstrip(b"\x00")  # noqa: E731
    es_der = head + "." + body + "." + b64(b"\x30" + bytes([len(der(r) + der(s_))]) + der(r) + der(s_))
    rsa_public = json.dumps(JWKS["keys"][0], separators=(",", ":")).encode()
    cases = [
        ("jwks rs256", bearer(rs)),
        ("jwks es256", bearer(es)),
        ("jwks es256, refreshed", bearer(sign_jws('{"iat":2,"aud":["billing","payments"],"sub":"cus_1","iss":"https://id.example","exp":1900000500}', "ES256", "ec-1", seed="k2"))),
        ("jwks another issuer", bearer(sign_jws(claims(',"iss":"https://evil.example","aud":"payments"'), "RS256", "rsa-1"))),
        ("jwks no issuer", bearer(sign_jws(claims(',"aud":"payments"'), "RS256", "rsa-1"))),
        ("jwks another audience", bearer(sign_jws(claims(',"iss":"https://id.example","aud":"billing"'), "ES256", "ec-1"))),
        ("jwks audience list without it", bearer(sign_jws(claims(',"iss":"https://id.example","aud":["billing"]'), "ES256", "ec-1"))),
        ("jwks no audience", bearer(sign_jws(claims(',"iss":"https://id.example"'), "ES256", "ec-1"))),
        ("jwks issuer escaped", bearer(sign_jws(claims(',"iss":"https:\\/\\/id.example","aud":"payments"'), "RS256", "rsa-1"))),
        ("jwks rs256 without kid, one rsa key", bearer(sign_jws(sub, "RS256"))),
        ("jwks es256 without kid, one ec key", bearer(sign_jws(sub, "ES256"))),
        ("jwks unknown kid", bearer(sign_jws(sub, "RS256", "rsa-2"))),
        ("jwks kid of another type", bearer(sign_jws(sub, "RS256", "ec-1"))),
        ("jwks kid of an encryption key", bearer(sign_jws(sub, "RS256", "enc-1"))),
        ("jwks numeric kid", bearer(sign_jws(sub, "RS256", 1))),
        ("jwks rs256 payload changed", bearer(rs.split(".")[0] + "." + b64(b'{"sub":"cus_2","iss":"https://id.example","aud":"payments","exp":1900000000,"iat":1}') + "." + rs.split(".")[2])),
        ("jwks es256 payload changed", bearer(head + "." + b64(b'{"sub":"cus_2","iss":"https://id.example","aud":"payments","exp":1900000000,"iat":1}') + "." + sig)),
        ("jwks es256 signature in DER", bearer(es_der)),
        ("jwks rs256 signature cut", bearer(rs[:-4])),
        ("jwks hs256 with the public key as secret", bearer(sign(sub, rsa_public, b'{"alg":"HS256","kid":"rsa-1"}'))),
        ("jwks hs256 token", bearer(sign(sub))),
        ("jwks alg none", bearer(sign(sub, header=b'{"alg":"none","kid":"rsa-1"}').rsplit(".", 1)[0] + ".")),
        ("jwks es256 expired", bearer(sign_jws('{"sub":"cus_1","iss":"https://id.example","aud":"payments","exp":1700000000}', "ES256", "ec-1"))),
        ("jwks rs256 numeric sub", bearer(sign_jws('{"sub":42,"iss":"https://id.example","aud":"payments","exp":1900000000}', "RS256", "rsa-1"))),
    ]
    return [(name, "jwt:sub", "scoped", headers, "jwks") for name, headers in cases]


def vectors():
    return [
        {
            "name": name,
            "scope_from": source,
            "anonymous": anonymous,
            "keys": keys,
            "headers": headers,
            "expect": scope(source, anonymous, headers, ("jwks", JWKS) if keys == "jwks" else ("hs256", SECRET),
                            exp_optional=keys == "hs256-exp-optional"),
        }
        for name, source, anonymous, headers, keys in (c if len(c) == 5 else (*c, "hs256") for c in cases())
    ]


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scope-vectors.json")
    doc = {"version": 1, "secret": SECRET.decode(), "jwks": JWKS, "issuer": ISSUER, "audience": AUDIENCE,
           "now": NOW, "vectors": vectors()}
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
