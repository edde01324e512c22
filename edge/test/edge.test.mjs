// The edge on Miniflare's API: each scenario against the built worker, its Durable
// Object storage read through the object's own API after each step, its alarm run on
// demand, the origin a scripted outbound handler. `npm test` in edge/ runs these alone;
// scripts/test runs them beside the workerd end-to-end tests (tests/tests/edge.rs),
// which put the same worker in front of a real origin.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { startEdge, stored, read, sleep, EDGE_SECRET } from "./harness.mjs";

// One edge for the scenarios that share wrangler.toml's settings: every test uses keys
// of its own.
const edge = await startEdge();
after(() => edge.dispose());

// The core's EXPIRY_GRACE_MS: a record is deleted this long after it expires, so that
// a claim racing its expiry still finds it.
const GRACE_MS = 1_000;
// How far the object's alarm may be from the time asked: the object counts the time
// left on its own clock, and the runtime keeps alarms to the millisecond.
const ALARM_SLACK_MS = 250;
const near = (actual, expected) => Math.abs(actual - expected) <= ALARM_SLACK_MS;
const hexOf = (text) => Buffer.from(text).toString("hex");

let keys = 0;
const freshKey = (what) => `${what}-${process.pid}-${++keys}`;

test("a charge is claimed, forwarded once, kept until the origin's expiry and replayed at the edge", async () => {
  const key = freshKey("charge");
  const expiresAt = Date.now() + 120_000;
  edge.origin.script = (seen) =>
    stored(seen, {
      status: 201,
      body: '{"id":"ch_1"}',
      headers: { "content-type": "application/json", location: "/v1/charges/ch_1", "x-request-cost": "3", "set-cookie": "s=1" },
      storedHeaders: "content-type, location, x-request-cost",
      expiresAt,
    });
  const before = edge.origin.calls;

  const first = await read(await edge.charge({ key }));
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get("idem-edge"), "forwarded");
  assert.equal(first.headers.get("idem-disposition"), null, "the origin's word to the edge is not the client's");
  assert.equal(first.headers.get("idem-stored-headers"), null);
  const sent = edge.origin.requests.at(-1);
  assert.equal(sent.headers["idem-edge-secret"], EDGE_SECRET, "a claimed request proves it comes from the edge");

  const kept = await edge.object(key).state();
  assert.ok(kept.record && kept.record.length > 64, `a record is stored as bytes: ${JSON.stringify(kept)}`);
  assert.ok(kept.record.includes(hexOf('{"id":"ch_1"}')), "with the answer's body");
  assert.ok(kept.record.includes(hexOf("x-request-cost")), "and a header the origin stored");
  assert.ok(!kept.record.includes(hexOf("s=1")), "but not one it did not");
  assert.ok(near(kept.alarm, expiresAt + GRACE_MS), `the alarm is set for the origin's expiry: ${kept.alarm - expiresAt} ms after it`);
  assert.deepEqual([kept.ops, kept.writes], [2, 4], "a claim and a completion, each one put and one alarm");

  const again = await read(await edge.charge({ key }));
  assert.equal(again.status, 201);
  assert.equal(again.text, '{"id":"ch_1"}');
  assert.equal(again.headers.get("idem-edge"), "replayed");
  assert.equal(again.headers.get("idempotent-replayed"), "true");
  assert.equal(again.headers.get("location"), "/v1/charges/ch_1");
  assert.equal(again.headers.get("x-request-cost"), "3");
  assert.equal(again.headers.get("set-cookie"), null);
  assert.equal(edge.origin.calls - before, 1, "the retry never reached the origin");
  const after = await edge.object(key).state();
  assert.deepEqual(after, { ...kept, ops: kept.ops + 1 }, "a replay writes nothing");
});

test("a body of 4 KiB and more (fingerprinted by WebCrypto) is kept and replayed as well", async () => {
  const key = freshKey("large");
  edge.origin.script = (seen) => stored(seen, { body: "large charge" });
  const before = edge.origin.calls;
  const body = { amount: 100, memo: "m".repeat(6_000) };
  assert.equal((await edge.charge({ key, body })).status, 201);
  const again = await read(await edge.charge({ key, body }));
  assert.equal(again.headers.get("idem-edge"), "replayed", "the edge's fingerprint is the origin's");
  const other = await read(await edge.charge({ key, body: { ...body, amount: 101 } }));
  assert.equal(other.status, 422, other.text);
  assert.equal(edge.origin.calls - before, 1);
});

test("while the origin works, the key is claimed: a retry gets 409, or with Prefer: wait the first attempt's answer", async () => {
  const key = freshKey("in-flight");
  const object = edge.object(key);
  const before = edge.origin.calls;
  let during;
  edge.origin.script = async (seen) => {
    // Storage mid-flight: the claim, without an answer, and its alarm set.
    const claim = await object.state();
    const busy = await read(await edge.charge({ key }));
    const waiting = edge.charge({ key, headers: { prefer: "wait=5" } });
    // Answer once the waiting retry has asked the object again (polled), not before.
    const polled = claim.ops + 3;
    const deadline = Date.now() + 5_000;
    while ((await object.state()).ops < polled && Date.now() < deadline) await sleep(20);
    during = { claim, busy, waiting, polled: (await object.state()).ops >= polled };
    return stored(seen, { status: 201, body: "charged once" });
  };
  const first = await read(await edge.charge({ key }));
  assert.equal(first.status, 201);
  assert.ok(during.claim.record && during.claim.alarm, `claimed: ${JSON.stringify(during.claim)}`);
  assert.ok(!during.claim.record.includes(hexOf("charged")));
  assert.equal(during.busy.status, 409, during.busy.text);
  assert.match(during.busy.json.type, /#request-in-flight$/);
  assert.equal(during.busy.headers.get("idem-edge"), "refused");
  assert.ok(during.polled, "the waiting retry polled the key while the first ran");
  const waited = await read(await during.waiting);
  assert.equal(waited.status, 201, waited.text);
  assert.equal(waited.text, "charged once");
  assert.equal(waited.headers.get("idem-edge"), "replayed");
  assert.equal(waited.headers.get("preference-applied"), "wait");
  assert.equal(edge.origin.calls - before, 1, "one charge");
});

test("a retry with another body under the same key is refused at the edge", async () => {
  const key = freshKey("mismatch");
  edge.origin.script = (seen) => stored(seen, { status: 201, body: "ok" });
  const before = edge.origin.calls;
  assert.equal((await edge.charge({ key, body: { amount: 100 } })).status, 201);
  const kept = await edge.object(key).state();
  const other = await read(await edge.charge({ key, body: { amount: 999 } }));
  assert.equal(other.status, 422, other.text);
  assert.match(other.json.type, /#idempotency-key-reused$/);
  assert.equal(other.headers.get("idem-edge"), "refused");
  assert.equal(edge.origin.calls - before, 1);
  assert.deepEqual(await edge.object(key).state(), { ...kept, ops: kept.ops + 1 }, "the record is untouched");
});

// What the edge must not keep: each claimed and forwarded with the edge's secret, said
// as `idem-edge`, released (the record holds no answer, and the retry is forwarded and
// answered by the origin again).
const notStored = [
  ["an answer without a stored disposition (not an idem origin's)", "forwarded", (body) => () => new Response(body, { status: 201 })],
  ["a 303 with no disposition (a login redirect in front of the origin)", "forwarded", () => () => new Response(null, { status: 303, headers: { location: "/login" } })],
  ["a WAF-style 429 without a disposition", "forwarded", (body) => () => new Response(body, { status: 429, headers: { "retry-after": "1" } })],
  ["an answer the origin released", "forwarded", (body) => () => new Response(body, { status: 400, headers: { "idem-disposition": "released" } })],
  ["an answer the origin has not stored yet (pending)", "forwarded", (body) => () => new Response(body, { status: 201, headers: { "idem-disposition": "pending" } })],
  ["an answer stored under another record (another scope rule)", "forwarded; other-record", (body) => (seen) => stored(seen, { body, record: "0".repeat(32) })],
  ["an answer stored under another fingerprint (a route's fingerprint rule)", "forwarded; other-fingerprint", (body) => (seen) => stored(seen, { body, fingerprint: "0".repeat(64) })],
  ["an answer stored under no fingerprint (an origin older than fingerprints in dispositions)", "forwarded; other-fingerprint", (body) => (seen) => stored(seen, { body, fingerprint: null })],
  ["an answer whose origin record has expired", "forwarded", (body) => (seen) => stored(seen, { body, expiresAt: Date.now() - 1 })],
  ["an answer with a damaged list of stored headers", "forwarded", (body) => (seen) => stored(seen, { body, storedHeaders: "content type" })],
];

for (const [what, handled, script] of notStored) {
  test(`not kept: ${what}`, async () => {
    const key = freshKey("not-kept");
    const body = `answer for ${key}`;
    edge.origin.script = script(body);
    const before = edge.origin.calls;
    const first = await edge.charge({ key });
    const status = first.status;
    await first.arrayBuffer();
    assert.equal(first.headers.get("idem-edge"), handled);
    assert.equal(edge.origin.requests.at(-1).headers["idem-edge-secret"], EDGE_SECRET, "claimed and forwarded");
    const state = await edge.object(key).state();
    assert.ok(state.record, "the claim's record stays, released");
    assert.ok(!state.record.includes(hexOf(body)), "with no answer in it");
    assert.deepEqual([state.ops, state.writes], [2, 4], "a claim and a release");
    const retry = await edge.charge({ key });
    await retry.arrayBuffer();
    assert.equal(retry.status, status, "the origin answers the retry");
    assert.equal(retry.headers.get("idem-edge"), handled);
    assert.equal(edge.origin.calls - before, 2, "both reached the origin");
    if (status === 303) {
      assert.equal(retry.headers.get("location"), "/login", "a redirect is relayed, never followed");
      assert.ok(edge.origin.requests.slice(before).every((r) => r.url.pathname === "/v1/charges"));
    }
  });
}

test("an origin that cannot be reached frees the key: 502 to retry with the same key, never 409", async () => {
  const unreachable = await startEdge({ scripted: false });
  try {
    const key = freshKey("unreachable");
    for (const attempt of [1, 2]) {
      const res = await read(await unreachable.charge({ key }));
      assert.equal(res.status, 502, `attempt ${attempt}: ${res.text}`);
      assert.match(res.json.type, /#origin-unreachable$/);
      assert.equal(res.headers.get("idem-edge"), "refused");
    }
    const state = await unreachable.object(key).state();
    assert.deepEqual([state.ops, state.writes], [4, 8], "claimed and released, twice");
  } finally {
    await unreachable.dispose();
  }
});

test("the alarm keeps a record until its expiry, and re-arms for it", async () => {
  const key = freshKey("alarm");
  const expiresAt = Date.now() + 60_000;
  edge.origin.script = (seen) => stored(seen, { body: "kept a minute", expiresAt });
  assert.equal((await edge.charge({ key })).status, 201);
  const early = await edge.object(key).runAlarm();
  assert.ok(early.record && early.record.includes(hexOf("kept a minute")), "run before the expiry, the alarm keeps the answer");
  assert.ok(near(early.alarm, expiresAt + GRACE_MS), `and sets itself again for the expiry: ${early.alarm - expiresAt} ms after it`);
});

test("the alarm deletes a record once its expiry and the grace after it are past", async (t) => {
  const key = freshKey("expiry");
  const expiresAt = Date.now() + 4_000;
  edge.origin.script = (seen) => stored(seen, { body: "short", expiresAt });
  assert.equal((await edge.charge({ key })).status, 201);
  const object = edge.object(key);
  assert.ok((await object.state()).record.includes(hexOf("short")));
  // Within the grace: kept (a claim racing the expiry still finds the record).
  await sleep(Math.max(0, expiresAt + 200 - Date.now()));
  const graceStart = Date.now();
  const inGrace = await object.runAlarm();
  if (Date.now() < expiresAt + GRACE_MS) {
    assert.ok(inGrace.record, "run within the grace after the expiry, the alarm keeps the record");
  } else {
    t.diagnostic(`the grace check was skipped: the call took ${Date.now() - graceStart} ms`);
  }
  await sleep(Math.max(0, expiresAt + GRACE_MS + 200 - Date.now()));
  const late = await object.runAlarm();
  assert.deepEqual([late.record, late.keys], [null, []], "run after it, the alarm deletes the record");
  edge.origin.script = (seen) => stored(seen, { body: "again" });
  const retry = await read(await edge.charge({ key }));
  assert.equal(retry.headers.get("idem-edge"), "forwarded", "the key is the origin's to answer again");
});

test("a record the edge cannot decode is kept by the alarm, which looks again in an hour", async () => {
  const key = freshKey("undecodable");
  const object = edge.object(key);
  await object.putRecord(new Uint8Array([0xff, 0x00, 0x13, 0x37]));
  const before = Date.now();
  const after = await object.runAlarm();
  assert.equal(after.record, "ff001337", "kept, byte for byte");
  assert.ok(after.alarm >= before + 3_600_000 - 1_000 && after.alarm <= Date.now() + 3_600_000 + 1_000, `re-armed an hour on: ${after.alarm - before} ms`);
  // A request for the key goes to the origin (which is authoritative), unclaimed at the
  // edge: the record is neither overwritten nor answered from.
  edge.origin.script = (seen) => stored(seen, { body: "from the origin" });
  const res = await read(await edge.charge({ key }));
  assert.equal(res.status, 201);
  assert.equal(res.headers.get("idem-edge"), "degraded");
  assert.equal(edge.origin.requests.at(-1).headers["idem-edge-secret"], undefined, "sent on unclaimed");
  assert.equal((await object.state()).record, "ff001337", "still untouched");
});

test("a storage put that fails when the answer is kept releases the key: the origin answers the retry", async () => {
  const key = freshKey("failed-put");
  const object = edge.object(key);
  // The claim's put has landed when the origin is called: fail the next one, the
  // completion's. The release after it lands.
  edge.origin.script = async (seen, n) => {
    await object.failPuts(1);
    return stored(seen, { body: `answer ${n}` });
  };
  const before = edge.origin.calls;
  const first = await read(await edge.charge({ key }));
  assert.equal(first.status, 201, "the client gets the origin's answer whatever the edge could keep");
  assert.equal(first.headers.get("idem-edge"), "forwarded");
  const state = await object.state();
  assert.ok(state.record, "the claim's record is there, released");
  assert.ok(!state.record.includes(hexOf("answer")), "with no answer in it");
  assert.equal(state.ops, 3, "a claim, a completion that failed, a release");
  edge.origin.script = (seen, n) => stored(seen, { body: `answer ${n}` });
  const retry = await read(await edge.charge({ key }));
  assert.equal(retry.headers.get("idem-edge"), "forwarded", `released, not in flight: ${retry.status} ${retry.text}`);
  assert.equal(retry.status, 201);
  assert.equal(edge.origin.calls - before, 2, "the origin answered the retry (an idem origin replays it)");
  const third = await read(await edge.charge({ key }));
  assert.equal(third.headers.get("idem-edge"), "replayed", "and the retry's answer is kept");
  assert.equal(edge.origin.calls - before, 2);
});

test("a storage put that fails at the claim sends the request on unclaimed, and keeps nothing", async () => {
  const key = freshKey("failed-claim");
  const object = edge.object(key);
  await object.failPuts(1);
  edge.origin.script = (seen) => stored(seen, { body: "charged" });
  const before = edge.origin.calls;
  const res = await read(await edge.charge({ key }));
  assert.equal(res.status, 201);
  assert.equal(res.headers.get("idem-edge"), "degraded");
  assert.equal(edge.origin.requests.at(-1).headers["idem-edge-secret"], undefined, "the origin guards it alone");
  // The put and the alarm are issued together; the put failed (injected), the alarm
  // may have landed: it finds no record and deletes nothing that matters.
  assert.deepEqual((await object.state()).keys, [], "no record stored");
  assert.equal(edge.origin.calls - before, 1);
});
