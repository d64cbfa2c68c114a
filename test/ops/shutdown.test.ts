/**
 * Boot and SIGTERM on a real server process (`node dist/src/main.js`, the
 * real model, its own SQLite store in a temp ASSAY_DATA_DIR, PORT=0).
 * A request is held in the worker with the test-only stall fault, driven over
 * HTTP (POST /__test/faults, only with ASSAY_TEST_FAULTS=1), so "in flight at
 * SIGTERM" is a fact, not a race.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { smallDeployment } from "../engine/engine.js";
import { body, until } from "./helpers.js";
import { startServer, stopServer, type ServerProcess } from "./server-process.js";
import { detailMessage } from "../../src/errors/catalogue.js";

let server: ServerProcess | null = null;
let dir = "";

afterEach(async () => {
  await stopServer(server, dir);
  server = null;
});

async function boot(env: Record<string, string> = {}) {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-shutdown-"));
  server = await startServer({ ...smallDeployment(), ASSAY_DATA_DIR: dir, ASSAY_TEST_FAULTS: "1", ...env });
  await server.waitForLog(/default model ready/);
  const key = fs.readFileSync(path.join(dir, "local-api-key"), "utf8").trim();
  return { s: server, key };
}

const ask = (s: ServerProcess, key: string, state: string) =>
  fetch(`${s.url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body(state)),
  });
const fault = async (s: ServerProcess, payload: object) =>
  (await fetch(`${s.url}/__test/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(payload) })).json() as Promise<{
    id: string;
  }>;
const inFlight = async (s: ServerProcess) => {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  return Number(/^assay_requests_in_flight (\d+)/m.exec(text)?.[1] ?? -1);
};

function ledgerOf(): { kinds: string[]; audit: unknown; credit: number; held: number } {
  const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
  try {
    const org = store.findOrg("local")!;
    const b = store.balance(org.id, Date.now());
    return { kinds: store.ledger(org.id).map((e) => `${e.kind}${e.note && e.kind === "release" ? ` ${e.note}` : ""}`), audit: store.audit(org.id), credit: b.creditMicro, held: b.heldMicro };
  } finally {
    store.close();
  }
}

describe("boot", () => {
  it("listens before the model is ready (log order), then readiness turns 200", async () => {
    const { s, key } = await boot();
    const order = s.log.map((l) => String(l.msg));
    const listening = order.findIndex((m) => /^assay listening/.test(m));
    const ready = order.findIndex((m) => /default model ready/.test(m));
    expect(listening).toBeGreaterThanOrEqual(0);
    expect(ready).toBeGreaterThan(listening);
    console.log(`[ops] startup: ${JSON.stringify(s.log[ready]?.startupSeconds)} s from listening to ready`);
    expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
    expect((await ask(s, key, "hello")).status).toBe(200);
    // The first-start key goes to stdout once, never into the JSON log.
    expect(JSON.stringify(s.log)).not.toContain(key);
  });
});

describe("SIGTERM", () => {
  it("stops accepting (503 + Retry-After), finishes the in-flight request, releases everything and exits 0", async () => {
    const { s, key } = await boot({ ASSAY_DRAIN_SECONDS: "60" });
    const stall = await fault(s, { kind: "stall" });
    const inflight = ask(s, key, "in flight at SIGTERM");
    await until(async () => (await inFlight(s)) === 1, "the request to be in flight");
    s.kill("SIGTERM");
    await s.waitForLog(/draining/);
    const refused = await ask(s, key, "after SIGTERM");
    expect(refused.status).toBe(503);
    expect(refused.headers.get("retry-after")).toBe("1");
    const refusedBody = (await refused.json()) as { detail: string; request_id: string };
    expect(detailMessage(refusedBody.detail)).toMatch(/shutting down/);
    expect(refusedBody.request_id).toBe(refused.headers.get("x-request-id"));
    expect((await fetch(`${s.url}/readyz`)).status).toBe(503);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    await fault(s, { release: stall.id });
    const done = await inflight;
    expect(done.status).toBe(200);
    expect(await s.exited).toEqual({ code: 0, signal: null });
    await s.waitForLog(/stopped/);
    const l = ledgerOf();
    expect(l.kinds).toEqual(["grant", "hold", "settle"]);
    expect(l.held).toBe(0);
  });

  it("past ASSAY_DRAIN_SECONDS the request still in flight is cancelled (503, no charge) and the process exits 0", async () => {
    const { s, key } = await boot({ ASSAY_DRAIN_SECONDS: "1" });
    await fault(s, { kind: "stall" });
    const inflight = ask(s, key, "never finishes");
    await until(async () => (await inFlight(s)) === 1, "the request to be in flight");
    s.kill("SIGTERM");
    const res = await inflight;
    expect(res.status).toBe(503);
    expect(detailMessage(((await res.json()) as { detail: unknown }).detail)).toMatch(/shut down before the request finished/);
    expect(await s.exited).toEqual({ code: 0, signal: null });
    expect(s.log.find((x) => /drain deadline reached/.test(String(x.msg)))).toMatchObject({ cancelled: 1, stuck: 0 });
    const l = ledgerOf();
    expect(l.kinds).toEqual(["grant", "hold", "release error 503 UNAVAILABLE"]);
    expect(l).toMatchObject({ credit: 1_000_000, held: 0 });
  });
});
