// A misconfigured edge says so on every request — 500 with the problem
// `edge-misconfigured`, naming the setting — and forwards nothing: guessing a default
// for a broken setting could put strangers in one scope or keep answers the origin
// never stored.

import { test } from "node:test";
import assert from "node:assert/strict";
import { startEdge, read } from "./harness.mjs";

const misconfigurations = [
  ["EDGE_SECRET unset", { EDGE_SECRET: undefined }, /EDGE_SECRET is not set/],
  ["EDGE_SECRET too short", { EDGE_SECRET: "short" }, /EDGE_SECRET: the edge secret is 5 bytes/],
  ["LEASE_MS not a number", { LEASE_MS: "ten seconds" }, /LEASE_MS/],
  ["TTL_MS past a year", { TTL_MS: String(400 * 24 * 3_600_000) }, /TTL_MS/],
  ["ANONYMOUS misspelt", { ANONYMOUS: "shared" }, /ANONYMOUS must be scoped or refused/],
  ["SCOPE_FROM a header the origin never gets", { SCOPE_FROM: "header:idem-edge-secret" }, /SCOPE_FROM/],
  ["KEY_HEADER naming a header a proxy sets anew", { KEY_HEADER: "x-request-id" }, /KEY_HEADER: x-request-id cannot carry the idempotency key/],
  ["FINGERPRINT_ONLY with FINGERPRINT_EXCEPT", { FINGERPRINT_ONLY: "/amount", FINGERPRINT_EXCEPT: "/sent_at" }, /not both/],
];

for (const [what, vars, names] of misconfigurations) {
  test(`misconfigured: ${what}`, async () => {
    const edge = await startEdge({ vars });
    try {
      for (const res of [await edge.charge({ key: "k-1" }), await edge.fetch("/v1/unguarded")]) {
        const answer = await read(res);
        assert.equal(answer.status, 500, answer.text);
        assert.equal(answer.headers.get("content-type"), "application/problem+json");
        assert.match(answer.json.type, /#edge-misconfigured$/);
        assert.match(answer.json.detail, names);
      }
      assert.equal(edge.origin.calls, 0, "nothing was forwarded");
    } finally {
      await edge.dispose();
    }
  });
}

test("the same edge, well configured, forwards (the scenarios above fail on their setting alone)", async () => {
  const edge = await startEdge();
  try {
    edge.origin.script = () => new Response("hello");
    const res = await read(await edge.fetch("/v1/unguarded"));
    assert.equal(res.status, 200, res.text);
    assert.equal(edge.origin.calls, 1);
  } finally {
    await edge.dispose();
  }
});
