// What an idem origin computes about a request, written again in JavaScript so that the
// scripted origin of these tests answers as a real one would: the caller's scope, the
// record key and its tag, the request's fingerprint (the core's `scope.rs` and
// `fingerprint.rs`; checked against the shared vectors in `vectors.test.mjs`).

import { createHash } from "node:crypto";

/** SHA-256 over a domain tag and length-prefixed parts (the core's `tagged_hash`). */
export function taggedHash(tag, parts) {
  const h = createHash("sha256");
  for (const part of [Buffer.from(tag), ...parts.map((p) => Buffer.from(p))]) {
    const len = Buffer.alloc(8);
    len.writeBigUInt64BE(BigInt(part.length));
    h.update(len);
    h.update(part);
  }
  return h.digest();
}

/** The scope of a caller by its `Authorization` header (SCOPE_FROM = "authorization"). */
export function scopeOfAuthorization(value) {
  if (value === undefined || value === null) {
    return taggedHash("idem/scope/anonymous/v1", []);
  }
  const bytes = Buffer.from(value);
  const credential = bytes.subarray(0, 7).toString("latin1").toLowerCase() === "bearer "
    ? Buffer.from(bytes.subarray(7).toString("latin1").trim(), "latin1")
    : bytes;
  return taggedHash("idem/scope/credential/v1", [credential]);
}

/** The record key (64 hex digits) of a bare `Idempotency-Key` in a scope: the name of
 * the key's Durable Object. */
export function recordKey(scope, key) {
  return taggedHash("idem/record/v1", [scope, Buffer.from(key)]).toString("hex");
}

/** The tag by which the origin names a record in its disposition header. */
export function recordTag(recordKeyHex) {
  return taggedHash("idem/record-tag/v1", [Buffer.from(recordKeyHex)])
    .subarray(0, 16)
    .toString("hex");
}

function mediaType(contentType) {
  return contentType ? contentType.split(";")[0].trim().toLowerCase() : "";
}

// Canonical JSON for the bodies these tests send: objects with sorted keys, strings,
// integers, booleans, null. Anything else is not canonicalised here (a test would
// compute a wrong fingerprint, and the vectors test would say so).
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  if (typeof value === "number" && !Number.isInteger(value)) {
    throw new Error(`not canonicalised in these tests: ${value}`);
  }
  return JSON.stringify(value);
}

/** The whole-request fingerprint (hex), as the origin and the edge compute it. */
export function fingerprint(method, pathAndQuery, contentType, body) {
  const essence = mediaType(contentType);
  const bytes = Buffer.from(body ?? "");
  const json = essence === "application/json" || (essence.endsWith("+json") && essence.includes("/"));
  let tag = "raw";
  let data = bytes;
  if (json) {
    try {
      data = Buffer.from(canonical(JSON.parse(bytes.toString("utf8"))));
      tag = "json";
    } catch {
      data = bytes;
    }
  }
  return taggedHash("idem/fingerprint/v1", [method, pathAndQuery, essence, tag, data]).toString("hex");
}
