#!/usr/bin/env python3
"""A payments API that knows nothing about idempotency: Python's standard library and
SQLite, no Rust. The proxy tests put `idem-origin --upstream` in front of it and count
its charges in its own database.

    python3 payments.py --port 9000 --db /tmp/payments.sqlite

POST /v1/charges   {"customer": str, "amount": int > 0, "currency": str,
                    "simulate_latency_ms": int (optional)}
                   -> 201 {"id", "customer", "amount", "currency"}, Location: /v1/charges/<id>
                   -> 400 on a malformed charge
POST /v1/fail/<status>   answers <status> without charging (a crashed or overloaded app)
POST /v1/nothing         answers 409 with the private release header: nothing happened
POST /v1/broken          promises a body and hangs up part-way
PUT  /v1/payouts/<id>    makes a payout -> 201 {"id", "payout"}; the path is routed as
                         servlet containers and case-insensitive routers route it:
                         `;` parameters dropped, encoded `/` and `\` and a plain `\` read
                         as `/`, dot segments resolved, case ignored
OPTIONS <any>            a CORS preflight: 204 allowing the requesting Origin, POST and PUT,
                         and the Idempotency-Key and Content-Type headers
GET  /healthz            -> 200 ok
GET  /calls              -> the number of POSTs so far, as text
Every POST is counted in `calls`. Every charge row keeps the Idempotency-Key, the fencing token and the downstream key
the proxy sent, so a test can see which request made which row.
"""

import argparse
import json
import sqlite3
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id TEXT PRIMARY KEY,
    customer TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    idempotency_key TEXT,
    fencing_token TEXT,
    downstream_key TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    path TEXT NOT NULL,
    idempotency_key TEXT,
    at REAL NOT NULL
);
"""


class Payments(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    db_path = ""
    release_header = "idem-release"
    lock = threading.Lock()

    def log_message(self, fmt, *args):  # quiet: the tests read the database
        pass

    def answer(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.cors()
        self.end_headers()
        self.wfile.write(data)

    def cors(self):
        """Any Origin may read this API's own answers (as a public API's CORS does)."""
        origin = self.headers.get("Origin")
        if origin:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")

    def do_OPTIONS(self):
        self.send_response(204)
        self.cors()
        self.send_header("Access-Control-Allow-Methods", "POST, PUT")
        self.send_header("Access-Control-Allow-Headers", "Idempotency-Key, Content-Type")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        if self.path == "/healthz":
            self.answer(200, {"ok": True})
        elif self.path == "/calls":
            # How many POSTs it got, as a bare number (the bench reads it).
            with sqlite3.connect(self.db_path, timeout=30) as db:
                count = db.execute("SELECT count(*) FROM calls").fetchone()[0]
            data = str(count).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.answer(404, {"error": "not found"})

    def do_PUT(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        routed = routed_path(self.path)
        with self.lock, sqlite3.connect(self.db_path, timeout=30) as db:
            db.execute(
                "INSERT INTO calls VALUES (?, ?, ?)",
                (self.path, self.headers.get("Idempotency-Key"), time.time()),
            )
        if not routed.startswith("/v1/payouts/"):
            self.answer(404, {"error": "not found"})
            return
        self.answer(201, {"id": "po_" + uuid.uuid4().hex[:24], "payout": routed.rsplit("/", 1)[1]})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        with self.lock, sqlite3.connect(self.db_path, timeout=30) as db:
            db.execute(
                "INSERT INTO calls VALUES (?, ?, ?)",
                (self.path, self.headers.get("Idempotency-Key"), time.time()),
            )
        if self.path.startswith("/v1/fail/"):
            self.answer(int(self.path.rsplit("/", 1)[1]), {"error": "failed"})
            return
        if self.path == "/v1/broken":
            # Promises 100 bytes, sends 10, hangs up: an answer that breaks off.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"partial"')
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path == "/v1/nothing":
            self.answer(409, {"error": "nothing happened"}, [(self.release_header, "1")])
            return
        if self.path != "/v1/charges":
            self.answer(404, {"error": "not found"})
            return
        try:
            charge = json.loads(raw or b"null")
            customer, amount, currency = charge["customer"], charge["amount"], charge["currency"]
            if not isinstance(amount, int) or amount <= 0:
                raise ValueError("amount")
        except (ValueError, KeyError, TypeError):
            self.answer(400, {"error": "invalid charge"})
            return
        time.sleep(int(charge.get("simulate_latency_ms") or 0) / 1000)
        charge_id = "ch_" + uuid.uuid4().hex[:24]
        with self.lock, sqlite3.connect(self.db_path, timeout=30) as db:
            db.execute(
                "INSERT INTO charges VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    charge_id,
                    customer,
                    amount,
                    currency,
                    self.headers.get("Idempotency-Key"),
                    self.headers.get("Idem-Fencing-Token"),
                    self.headers.get("Idem-Downstream-Key"),
                    time.time(),
                ),
            )
        self.answer(
            201,
            {"id": charge_id, "customer": customer, "amount": amount, "currency": currency},
            [("Location", "/v1/charges/" + charge_id), ("Set-Cookie", "seen=1"), ("Set-Cookie", "lang=en"),
             ("ETag", '"' + charge_id + '"'), ("Link", "</v1/charges/" + charge_id + '>; rel="self"')],
        )


def routed_path(raw):
    """The path as a lenient router takes it: what idem must guard in every spelling."""
    path = raw.split("?", 1)[0]
    path = "/".join(segment.split(";", 1)[0] for segment in path.split("/"))
    for separator in ("%2f", "%2F", "%5c", "%5C", "\\"):
        path = path.replace(separator, "/")
    path = path.replace("%2e", ".").replace("%2E", ".")
    segments = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments).lower()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    parser.add_argument("--db", required=True)
    parser.add_argument("--release-header", default="idem-release")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the key of --tls-cert (PEM)")
    parser.add_argument("--client-ca", help="require a client certificate signed by this CA (PEM)")
    args = parser.parse_args()
    with sqlite3.connect(args.db) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(SCHEMA)
    Payments.db_path = args.db
    Payments.release_header = args.release_header
    # A deep accept queue: the tests open hundreds of connections at once.
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer((args.host, args.port), Payments)
    server.daemon_threads = True
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(args.client_ca)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
