"""RS256 and ES256 (RFC 7518) in pure Python, for the scope vectors: an independent
check of the Rust core's verification, with no library shared between the two.
Keys and signatures are made from a seeded generator, so the vectors are the same on
every run. Not for production use: nothing here is constant-time.
"""

import hashlib
import random

# SHA-256's DigestInfo prefix (RFC 8017, 9.2 note 1).
SHA256_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


def _probable_prime(n, rng, rounds=40):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for _ in range(rounds):
        x = pow(rng.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def rsa_key(bits, seed):
    """(n, e, d) of an RSA key of `bits` bits."""
    rng = random.Random(seed)
    e = 65537
    while True:
        primes = []
        while len(primes) < 2:
            c = rng.getrandbits(bits // 2) | (3 << (bits // 2 - 2)) | 1
            if _probable_prime(c, rng) and (c - 1) % e != 0:
                primes.append(c)
        p, q = primes
        n = p * q
        if n.bit_length() == bits and p != q:
            return n, e, pow(e, -1, (p - 1) * (q - 1))


def _emsa(message, k):
    t = SHA256_INFO + hashlib.sha256(message).digest()
    return b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t


def rs256_sign(message, n, d):
    k = (n.bit_length() + 7) // 8
    return pow(int.from_bytes(_emsa(message, k), "big"), d, n).to_bytes(k, "big")


def rs256_verify(message, signature, n, e):
    k = (n.bit_length() + 7) // 8
    if len(signature) != k:
        return False
    s = int.from_bytes(signature, "big")
    if s >= n:
        return False
    return pow(s, e, n).to_bytes(k, "big") == _emsa(message, k)


# P-256 (FIPS 186-4, D.1.2.3).
P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)


def on_curve(point):
    x, y = point
    return 0 <= x < P and 0 <= y < P and (y * y - x * x * x - A * x - B) % P == 0


def _add(p1, p2):
    if p1 is None:
        return p2
    if p2 is None:
        return p1
    (x1, y1), (x2, y2) = p1, p2
    if x1 == x2 and (y1 + y2) % P == 0:
        return None
    if p1 == p2:
        m = (3 * x1 * x1 + A) * pow(2 * y1, -1, P) % P
    else:
        m = (y2 - y1) * pow(x2 - x1, -1, P) % P
    x3 = (m * m - x1 - x2) % P
    return x3, (m * (x1 - x3) - y1) % P


def _mul(k, point):
    result = None
    while k:
        if k & 1:
            result = _add(result, point)
        point = _add(point, point)
        k >>= 1
    return result


def ec_key(seed):
    """(d, (x, y)) of a P-256 key."""
    d = random.Random(seed).randrange(1, N)
    return d, _mul(d, G)


def es256_sign(message, d, seed):
    """The JWS signature: r and s, 32 bytes each, big-endian."""
    rng = random.Random(seed)
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    while True:
        k = rng.randrange(1, N)
        r = _mul(k, G)[0] % N
        s = pow(k, -1, N) * (e + r * d) % N
        if r and s:
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def es256_verify(message, signature, point):
    if len(signature) != 64 or not on_curve(point):
        return False
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    if not (0 < r < N and 0 < s < N):
        return False
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    w = pow(s, -1, N)
    x = _add(_mul(e * w % N, G), _mul(r * w % N, point))
    return x is not None and x[0] % N == r
