// A deployment's own settings, tested the way the edge guide (docs/guide/edge.md) shows: start an
// edge with them, script the origin, send what clients send.

import { test } from "node:test";
import assert from "node:assert/strict";
import { startEdge, stored, read } from "./harness.mjs";

test("my API: keys required under /v2/orders, callers without credentials refused", async () => {
  const edge = await startEdge({ vars: { REQUIRE_KEY_PATHS: "/v2/*", ANONYMOUS: undefined } });
  try {
    const order = (headers) => edge.fetch("/v2/orders", { method: "POST", headers: { "content-type": "application/json", ...headers }, body: '{"sku":"a-1"}' });
    const keyless = await read(await order({ authorization: "Bearer t1" }));
    assert.equal(keyless.status, 400, keyless.text);
    assert.match(keyless.json.type, /#idempotency-key-missing$/);
    const stranger = await read(await order({ "idempotency-key": "o-1" }));
    assert.equal(stranger.status, 401, stranger.text);
    assert.equal(edge.origin.calls, 0, "neither reached the origin");

    edge.origin.script = (seen) => stored(seen, { status: 201, body: "ordered", expiresIn: 3_600_000 });
    const first = await order({ authorization: "Bearer t1", "idempotency-key": "o-1" });
    assert.equal(first.status, 201);
    const again = await read(await order({ authorization: "Bearer t1", "idempotency-key": "o-1" }));
    assert.equal(again.headers.get("idem-edge"), "replayed");
    const otherTenant = await read(await order({ authorization: "Bearer t2", "idempotency-key": "o-1" }));
    assert.equal(otherTenant.headers.get("idem-edge"), "forwarded", "another tenant's key is its own");
    assert.equal(edge.origin.calls, 2);
    const { alarm } = await edge.object("o-1", "t1").state();
    assert.ok(alarm > Date.now() + 3_500_000, "kept for the hour the origin keeps it");
  } finally {
    await edge.dispose();
  }
});
