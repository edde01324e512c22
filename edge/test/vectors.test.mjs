// The scripted origin computes scopes, record keys and fingerprints as idem does: its
// JavaScript is checked against the vectors the Python reference and the Rust core
// check (shared/testdata), so a scenario that fails fails on the edge, not on them.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { repo } from "./harness.mjs";
import * as idem from "./idem.mjs";

const load = (name) => JSON.parse(readFileSync(`${repo}/shared/testdata/${name}`, "utf8")).vectors;

test("fingerprints of the shared vectors", () => {
  // Those whose bodies the scripted origin can canonicalise (integers, plain strings):
  // the bodies these tests send.
  const names = [
    "charge", "charge reordered keys", "charge with whitespace", "charge content-type params and case",
    "charge with query", "charge as PATCH", "nested objects reordered", "empty body no content type",
    "empty object", "invalid json hashed raw", "binary body", "form body exact", "text body whitespace matters",
    "vendor json type",
  ];
  const vectors = load("fingerprint-vectors.json").filter((v) => names.includes(v.name));
  assert.equal(vectors.length, names.length, "every named vector is in the file");
  for (const v of vectors) {
    const body = Buffer.from(v.body_hex, "hex");
    assert.equal(idem.fingerprint(v.method, v.path_and_query, v.content_type ?? undefined, body), v.fingerprint, v.name);
  }
});

test("scopes by Authorization of the shared vectors", () => {
  // The forms these tests send (the edge's full rule, other schemes and malformed
  // values included, is checked in Rust against all of them).
  const names = ["no identity, scoped", "bearer token", "bearer, scheme in capitals", "another scheme, whole value"];
  const vectors = load("scope-vectors.json").filter((v) => names.includes(v.name));
  assert.equal(vectors.length, names.length, "every named vector is in the file");
  for (const v of vectors) {
    const auth = Object.entries(v.headers).find(([n]) => n.toLowerCase() === "authorization")?.[1];
    assert.equal(idem.scopeOfAuthorization(auth).toString("hex"), v.expect, v.name);
  }
});
