// The edge under Miniflare: the worker `wrangler deploy --dry-run` built (in
// target/edge-bundle, or IDEM_EDGE_BUNDLE), with the Durable Object binding, vars and
// compatibility date of the repository's wrangler.toml, and the origin replaced by a
// scripted outbound handler — so each scenario is deterministic and needs no origin
// process.

import { readdirSync, readFileSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";
import * as idem from "./idem.mjs";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "../..");
export const bundle = resolve(process.env.IDEM_EDGE_BUNDLE ?? join(repo, "target/edge-bundle"));

/** The origin's address in these tests: the outbound handler answers for it, and
 * unscripted, nothing listens there. */
export const ORIGIN = "http://127.0.0.1:9";
/** The secret the scripted origin knows: it tells only this edge what it stored. */
export const EDGE_SECRET = "a-secret-of-the-edge-for-its-tests-0123456789";

function bundleModules() {
  if (!existsSync(join(bundle, "index.js"))) {
    throw new Error(
      `no built worker in ${bundle}: build it first (npm test in edge/ does; or ` +
        "`wrangler deploy --dry-run --outdir target/edge-bundle` from the repository)",
    );
  }
  const modules = [{ type: "ESModule", path: join(bundle, "worker.mjs"), contents: readFileSync(join(here, "worker.mjs"), "utf8") }];
  for (const name of readdirSync(bundle)) {
    if (name.endsWith(".js")) modules.push({ type: "ESModule", path: join(bundle, name) });
    else if (name.endsWith(".wasm")) modules.push({ type: "CompiledWasm", path: join(bundle, name) });
  }
  return modules;
}

/** What wrangler.toml says of the worker, as wrangler would give it to Miniflare. */
function fromWranglerToml() {
  const { workerOptions } = unstable_getMiniflareWorkerOptions(join(repo, "wrangler.toml"));
  return workerOptions;
}

/**
 * Starts the edge. `vars` override wrangler.toml's (`undefined` removes one); the
 * outbound handler is `origin.script`, one call per request the edge sends (a throw
 * there is a 500 from the origin, not a lost connection: for that, `scripted: false`).
 */
export async function startEdge({ vars = {}, scripted = true } = {}) {
  const fromToml = fromWranglerToml();
  const bindings = { ...fromToml.bindings, ORIGIN_URL: ORIGIN, EDGE_SECRET, ...vars };
  for (const [name, value] of Object.entries(bindings)) if (value === undefined) delete bindings[name];
  const origin = new ScriptedOrigin();
  const mf = new Miniflare({
    ...fromToml,
    name: "idem-edge",
    modules: bundleModules(),
    modulesRoot: bundle,
    bindings,
    // Unscripted, the worker's fetches go out for real (to ORIGIN_URL, a closed port).
    ...(scripted ? { outboundService: (request) => origin.receive(request) } : {}),
    // Nothing outlives the test: storage in memory.
    durableObjectsPersist: false,
  });
  await mf.ready;
  const namespace = await mf.getDurableObjectNamespace("IDEM_RECORDS");
  return new Edge(mf, namespace, origin);
}

export class Edge {
  constructor(mf, namespace, origin) {
    this.mf = mf;
    this.namespace = namespace;
    this.origin = origin;
  }

  /** A client's request to the edge. */
  fetch(path, init = {}) {
    return this.mf.dispatchFetch(new URL(path, "https://api.example").href, { redirect: "manual", ...init });
  }

  /** A charge as a client sends it: POST /v1/charges with a key and a bearer token. */
  charge({ key, token = "tenant-1", body = { amount: 100, currency: "eur" }, headers = {} }) {
    return this.fetch("/v1/charges", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        authorization: `Bearer ${token}`,
        "idempotency-key": key,
        ...headers,
      },
      body: JSON.stringify(body),
    });
  }

  /** The Durable Object of `key` for a bearer `token`, as the edge names it. */
  object(key, token = "tenant-1") {
    const name = idem.recordKey(idem.scopeOfAuthorization(`Bearer ${token}`), key);
    return new RecordObject(this.namespace.get(this.namespace.idFromName(name)));
  }

  dispose() {
    return this.mf.dispose();
  }
}

/** One key's Durable Object, through the test routes of worker.mjs. */
export class RecordObject {
  constructor(stub) {
    this.stub = stub;
  }

  async #call(method, path, body) {
    const res = await this.stub.fetch(`https://record.test${path}`, { method, body });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return JSON.parse(text);
  }

  /** `{ record: hex | null, alarm: ms | null, keys }`: what its storage holds. */
  state() {
    return this.#call("GET", "/__test/state");
  }

  /** Runs its alarm now, and returns the storage after it. */
  runAlarm() {
    return this.#call("POST", "/__test/alarm");
  }

  /** Stores `bytes` as its record, bypassing the edge. */
  putRecord(bytes) {
    return this.#call("PUT", "/__test/record", bytes);
  }

  /** Makes its next `n` storage puts throw. */
  failPuts(n = 1) {
    return this.#call("POST", `/__test/fail-puts?n=${n}`);
  }
}

/**
 * The origin, scripted: `script(request, body, call)` answers each request the edge
 * sends (a Response, or a throw for a connection that failed). Requests are recorded.
 */
export class ScriptedOrigin {
  constructor() {
    this.requests = [];
    this.script = () => new Response("no script for this request", { status: 599 });
  }

  async receive(request) {
    const body = Buffer.from(await request.arrayBuffer());
    const headers = Object.fromEntries(request.headers);
    const url = new URL(request.url);
    const seen = { method: request.method, url, pathAndQuery: url.pathname + url.search, headers, body };
    this.requests.push(seen);
    return this.script(seen, this.requests.length);
  }

  /** How many requests reached the origin. */
  get calls() {
    return this.requests.length;
  }
}

/**
 * The answer of an idem origin that stored it: the disposition, told only to a
 * request that carries the edge's secret, naming the record and fingerprint the origin
 * computes for the request (`fingerprint: null`: none, as an older origin), an expiry
 * `expiresIn` ms from now (or `expiresAt`), and the headers it stored (all it sent, or
 * `storedHeaders`).
 */
export function stored(seen, { status = 201, body = "", headers = {}, expiresIn = 60_000, expiresAt, record, fingerprint, storedHeaders } = {}) {
  const out = new Headers(headers);
  if (seen.headers["idem-edge-secret"] === EDGE_SECRET) {
    // The key as the core parses it: a bare token (these tests send no quoted keys).
    const key = idem.recordKey(idem.scopeOfAuthorization(seen.headers.authorization), seen.headers["idempotency-key"]);
    const fp = fingerprint === undefined
      ? `; fingerprint=${idem.fingerprint(seen.method, seen.pathAndQuery, seen.headers["content-type"], seen.body)}`
      : fingerprint === null ? "" : `; fingerprint=${fingerprint}`;
    const at = expiresAt ?? Date.now() + expiresIn;
    out.set("idem-disposition", `stored; expires=${at}; record=${record ?? idem.recordTag(key)}${fp}`);
    // What a real origin says of every stored answer: which of its headers it stored.
    out.set("idem-stored-headers", storedHeaders ?? [...out.keys()].filter((n) => !n.startsWith("idem-")).join(", "));
  }
  return new Response(body === "" ? null : body, { status, headers: out });
}

/** Reads a response's body as JSON, with its status and headers beside it. */
export async function read(res) {
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

/** Waits `ms` milliseconds. */
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
