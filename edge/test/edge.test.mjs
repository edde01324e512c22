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

let keys = 0;
const freshKey = (what) => `${what}-${process.pid}-${++keys}`;

test("a charge is claimed, forwarded once, kept until the origin's expiry and replayed at the edge", async () => {
  const key = freshKey("charge");
  const expiresAt = Date.now() + 120_000;
  edge.origin.script = (seen) =>
    stored(seen, { status: 201, body: '{"id":"ch_1"}', headers: { "content-type": "application/json", location: "/v1/charges/ch_1" }, expiresAt });
  const before = edge.origin.calls;

  const first = await read(await edge.charge({ key }));
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get("idem-edge"), "forwarded");
  assert.equal(first.headers.get("idem-disposition"), null, "the origin's word to the edge is not the client's");
  const sent = edge.origin.requests.at(-1);
  assert.equal(sent.headers["idem-edge-secret"], EDGE_SECRET, "a claimed request proves it comes from the edge");

  const kept = await edge.object(key).state();
  assert.ok(kept.record && kept.record.length > 64, `a record is stored as bytes: ${JSON.stringify(kept)}`);
  assert.ok(kept.record.includes(Buffer.from('{"id":"ch_1"}').toString("hex")), "with the answer's body");
  assert.ok(near(kept.alarm, expiresAt + GRACE_MS), `the alarm is set for the origin's expiry: ${kept.alarm - expiresAt} ms after it`);

  const again = await read(await edge.charge({ key }));
  assert.equal(again.status, 201);
  assert.equal(again.text, '{"id":"ch_1"}');
  assert.equal(again.headers.get("idem-edge"), "replayed");
  assert.equal(again.headers.get("idempotent-replayed"), "true");
  assert.equal(again.headers.get("location"), "/v1/charges/ch_1");
  assert.equal(edge.origin.calls - before, 1, "the retry never reached the origin");
  assert.deepEqual(await edge.object(key).state(), kept, "a replay writes nothing");
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
    during = { claim, busy, waiting };
    await sleep(300);
    return stored(seen, { status: 201, body: "charged once" });
  };
  const first = await read(await edge.charge({ key }));
  assert.equal(first.status, 201);
  assert.ok(during.claim.record && during.claim.alarm, `claimed: ${JSON.stringify(during.claim)}`);
  assert.ok(!during.claim.record.includes(Buffer.from("charged").toString("hex")));
  assert.equal(during.busy.status, 409, during.busy.text);
  assert.match(during.busy.json.type, /#request-in-flight$/);
  assert.equal(during.busy.headers.get("idem-edge"), "refused");
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
  const other = await read(await edge.charge({ key, body: { amount: 999 } }));
  assert.equal(other.status, 422, other.text);
  assert.match(other.json.type, /idempotency-key-reused|mismatch/);
  assert.equal(edge.origin.calls - before, 1);
});

// What the edge must not keep: each is forwarded to the origin again on the retry, and
// the key's record at the edge is released, never holding an answer.
const notStored = [
  ["an answer without a stored disposition (not an idem origin's)", (seen) => new Response("made", { status: 201 })],
  ["a 303 with no disposition (a login redirect in front of the origin)", () => new Response(null, { status: 303, headers: { location: "/login" } })],
  ["a WAF-style 429 without a disposition", () => new Response("slow down", { status: 429, headers: { "retry-after": "1" } })],
  ["an answer the origin released", () => new Response("invalid", { status: 400, headers: { "idem-disposition": "released" } })],
  ["an answer stored under another record (another scope rule)", (seen) => stored(seen, { record: "0".repeat(32) })],
  ["an answer stored under another fingerprint (a route's fingerprint rule)", (seen) => stored(seen, { fingerprint: "0".repeat(64) })],
  ["an answer whose origin record has expired", (seen) => stored(seen, { expiresAt: Date.now() - 1 })],
];

for (const [what, answer] of notStored) {
  test(`not kept: ${what}`, async () => {
    const key = freshKey("not-kept");
    edge.origin.script = answer;
    const before = edge.origin.calls;
    const first = await edge.charge({ key });
    const status = first.status;
    await first.arrayBuffer();
    const state = await edge.object(key).state();
    assert.ok(!state.record || !state.record.includes(Buffer.from("made").toString("hex")), "no answer kept");
    const retry = await edge.charge({ key });
    await retry.arrayBuffer();
    assert.equal(retry.status, status, "the origin answers the retry");
    assert.notEqual(retry.headers.get("idem-edge"), "replayed");
    assert.equal(edge.origin.calls - before, 2, "both reached the origin");
    if (status === 303) {
      assert.equal(retry.headers.get("location"), "/login", "a redirect is relayed, never followed");
      assert.ok(edge.origin.requests.slice(before).every((r) => r.url.pathname === "/v1/charges"));
    }
  });
}

test("the alarm keeps a record until its expiry and deletes it then", async () => {
  const key = freshKey("alarm");
  const expiresAt = Date.now() + 2_500;
  edge.origin.script = (seen) => stored(seen, { body: "short", expiresAt });
  assert.equal((await edge.charge({ key })).status, 201);
  const object = edge.object(key);
  const early = await object.runAlarm();
  assert.ok(early.record, "run before the expiry, the alarm keeps the record");
  assert.ok(near(early.alarm, expiresAt + GRACE_MS), `and sets itself again for the expiry: ${early.alarm - expiresAt} ms after it`);
  await sleep(expiresAt + GRACE_MS - Date.now() + 200);
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
  assert.ok(!state.record.includes(Buffer.from("answer").toString("hex")), "with no answer in it");
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
  assert.deepEqual((await object.state()).keys, [], "nothing stored");
  assert.equal(edge.origin.calls - before, 1);
});
