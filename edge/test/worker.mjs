// The built worker as the tests run it: its fetch handler as is, and its Durable Object
// wrapped so that a test can, through the object's own storage API, read what it
// stored and how often it was asked and wrote (`GET /__test/state`), write a record by
// hand (`PUT /__test/record`), run its alarm on demand (`POST /__test/alarm`) and make
// its next storage puts fail (`POST /__test/fail-puts?n=N`). Test-only: never part of
// the deployed worker, and these paths reach the object only from a test's stub, never
// through the worker.

import { DurableObject } from "cloudflare:workers";
import worker, { IdemRecord as BuiltRecord } from "./index.js";

export default worker;

// Puts still to fail, and the writes and operations seen, per object. Module state,
// not the instance's: the runtime may build the object again between two requests.
const failingPuts = new Map();
const counts = new Map();
const WRITES = new Set(["put", "delete", "deleteAll", "setAlarm", "deleteAlarm", "transaction"]);

function counted(id) {
  if (!counts.has(id)) counts.set(id, { ops: 0, writes: 0 });
  return counts.get(id);
}

function bound(target, name) {
  const value = Reflect.get(target, name);
  return typeof value === "function" ? value.bind(target) : value;
}

// The object's state as the built object sees it: the same storage, except for puts
// a test asked to fail.
function withFaults(ctx) {
  const id = ctx.id.toString();
  const storage = new Proxy(ctx.storage, {
    get(target, name) {
      if (WRITES.has(name)) counted(id).writes++;
      if (name === "put" && (failingPuts.get(id) ?? 0) > 0) {
        return () => {
          failingPuts.set(id, failingPuts.get(id) - 1);
          return Promise.reject(new Error("storage put failed (injected by the test)"));
        };
      }
      return bound(target, name);
    },
  });
  return new Proxy(ctx, {
    get: (target, name) => (name === "storage" ? storage : bound(target, name)),
  });
}

function hex(value) {
  if (value === undefined) return null;
  if (typeof value === "string") return { text: value };
  const bytes = value instanceof ArrayBuffer ? new Uint8Array(value) : value;
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export class IdemRecord extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.built = new BuiltRecord(withFaults(ctx), env);
  }

  async fetch(request) {
    const url = new URL(request.url);
    if (!url.pathname.startsWith("/__test/")) {
      counted(this.ctx.id.toString()).ops++;
      return this.built.fetch(request);
    }
    const storage = this.ctx.storage;
    switch (`${request.method} ${url.pathname}`) {
      case "GET /__test/state":
        break;
      case "PUT /__test/record":
        await storage.put("record", new Uint8Array(await request.arrayBuffer()));
        break;
      case "POST /__test/alarm": {
        const answer = await this.built.alarm();
        if (answer && answer.status !== 200) {
          return new Response(`alarm answered ${answer.status}`, { status: 500 });
        }
        break;
      }
      case "POST /__test/fail-puts":
        failingPuts.set(this.ctx.id.toString(), Number(url.searchParams.get("n") ?? 1));
        break;
      default:
        return new Response("no such test route", { status: 404 });
    }
    const keys = [...(await storage.list()).keys()];
    // `ops`: the worker's operations on the object; `writes`: the storage writes the
    // built object issued (those that failed included).
    const { ops, writes } = counted(this.ctx.id.toString());
    return Response.json({
      record: hex(await storage.get("record")),
      alarm: await storage.getAlarm(),
      keys,
      ops,
      writes,
    });
  }

  alarm(info) {
    return this.built.alarm(info);
  }
}
