/**
 * The hosted originals' official Python SDKs against a live assay server on
 * the real model: typesafe-sdk (`TypeSafeClient.system_one`), bespokelabs
 * (Stainless-generated, `client.nimble.system_one`, `api_key` header,
 * POST /v1/nimble/systemone) and bespokelabs-nimble (`Nimble.system_one`,
 * `models`, `limits`, `health`). They are installed from PyPI at pinned
 * versions into a private venv, `.cache/clients-venv` (git-ignored), and
 * driven by run_clients.py, which prints one JSON report. They are called as
 * users call them: no `model` argument (each sends its own default name,
 * `jev-latest` or `nimble-latest`, which models/models.json aliases to
 * judge-latest) and typesafe-sdk with its `zstd` extra, so it compresses
 * every body of 1 KiB or more.
 *
 * Asserted for each: the three question types under the client's default
 * name, a 422 (unknown model) with the spec's detail surfaced by the client,
 * and request-id handling (a caller's `x-request-id` echoed; the server's own
 * id where the client reads one). For typesafe-sdk also a large state, which
 * the server's own log shows arrived zstd-compressed and was decoded.
 */
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { AddressInfo } from "node:net";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { createLogger } from "../../src/observability/logger.js";
import { EnginePipeline } from "../../src/pipeline/index.js";
import { detailMessage } from "../../src/errors/catalogue.js";

const PACKAGES = ["typesafe-sdk[zstd]==0.7.5", "bespokelabs==0.4.0", "bespokelabs-nimble==0.1.0"];
const VENV = path.join(ROOT, ".cache", "clients-venv");
const PY = path.join(VENV, "bin", "python");

type Answer = { type: string; noul?: number; choice?: string; score?: number; probabilities?: Record<string, number>; legend?: Record<string, string> };
interface ClientReport {
  crashed?: string;
  trace?: string;
  model?: string;
  usage?: { input_tokens: number; output_tokens: number };
  answers?: Record<string, Answer>;
  error?: { class: string; status: number; request_id: string | null; message?: string; body: { detail: unknown; request_id: string } } | string;
  [k: string]: unknown;
}

function ensureVenv(): void {
  const stamp = path.join(VENV, ".assay-clients");
  if (fs.existsSync(PY) && fs.existsSync(stamp) && fs.readFileSync(stamp, "utf8") === PACKAGES.join(" ")) return;
  const run = (cmd: string, args: string[]) => {
    const r = spawnSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  };
  if (!fs.existsSync(PY)) run(process.env.ASSAY_PYTHON ?? "python3", ["-m", "venv", VENV]);
  run(PY, ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", ...PACKAGES]);
  fs.writeFileSync(stamp, PACKAGES.join(" "));
}

let engine: EnginePipeline;
let app: FastifyInstance;
let accounts: SqliteAccountsStore;
let dir: string;
let report: Record<string, ClientReport>;
/** The server's structured log (debug and up), one JSON object per line. */
let logs = "";
const logLines = () =>
  logs
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Record<string, unknown>);

beforeAll(async () => {
  ensureVenv();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-clients-"));
  // The general model only: the clients never name a code search or fact check model.
  const config = loadConfig({ ...process.env, ASSAY_DATA_DIR: dir, LOG_LEVEL: "silent", ASSAY_MODEL_SCHEDULE: "never" });
  engine = await EnginePipeline.create(config);
  accounts = new SqliteAccountsStore(dir, { startingGrantMicro: config.startingGrantMicro });
  const { key } = accounts.createKey("acme");
  const logger = createLogger("debug", { write: (line: string) => void (logs += line) });
  app = buildApp({ config, pipeline: engine, accounts, logger });
  await app.listen({ port: 0, host: "127.0.0.1" });
  const { port } = app.server.address() as AddressInfo;
  // Python runs while the server answers in this process: spawn it asynchronously.
  const child = spawn(PY, [path.join(ROOT, "test", "clients", "run_clients.py")], {
    env: { ...process.env, ASSAY_URL: `http://127.0.0.1:${port}`, ASSAY_KEY: key, TYPESAFE_LOG_LEVEL: "off" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout.on("data", (c: Buffer) => (out += c.toString()));
  child.stderr.on("data", (c: Buffer) => (err += c.toString()));
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  if (code !== 0) throw new Error(`run_clients.py exited ${code}:\n${out}\n${err}`);
  report = JSON.parse(out) as Record<string, ClientReport>;
}, 600_000);

afterAll(async () => {
  await app?.close();
  await engine?.close();
  accounts?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

function expectThreeTypes(r: ClientReport, model: string) {
  expect(r.crashed, r.trace).toBeUndefined();
  // The client's default name, echoed as sent.
  expect(r.model).toBe(model);
  expect(r.usage!.input_tokens).toBeGreaterThan(20);
  expect(r.usage!.output_tokens).toBe(0);
  const a = r.answers!;
  expect(a.refund!.type).toBe("noul");
  expect(a.refund!.noul).toBeGreaterThanOrEqual(0);
  expect(a.refund!.noul).toBeLessThanOrEqual(1);
  expect(a.topic!.type).toBe("choice");
  expect(["delivery", "billing"]).toContain(a.topic!.choice);
  expect(Object.values(a.topic!.probabilities!).reduce((s, p) => s + p, 0)).toBeCloseTo(1, 5);
  expect(a.mood!.type).toBe("score");
  expect(Object.keys(a.mood!.legend!)).toEqual(["0", "1", "2", "3", "4"]);
  expect(a.mood!.score).toBeGreaterThanOrEqual(0);
  expect(a.mood!.score).toBeLessThanOrEqual(4);
}

function expect422(r: ClientReport, id: string | null) {
  const e = r.error as Exclude<ClientReport["error"], string | undefined>;
  expect(typeof e, String(r.error)).toBe("object");
  expect(e.status).toBe(422);
  expect(detailMessage(e.body.detail)).toMatch(/unknown model "no-such-model"/);
  expect(e.request_id).toBe(e.body.request_id);
  if (id !== null) expect(e.request_id).toBe(id);
}

describe("typesafe-sdk[zstd] 0.7.5", () => {
  it("answers noul, choice and score through TypeSafeClient.system_one under its default name jev-latest", () => {
    expectThreeTypes(report["typesafe-sdk"]!, "jev-latest");
    const r = report["typesafe-sdk"]!;
    expect(r.nouls).toEqual(["refund"]);
    expect(r.choices).toEqual(["topic"]);
    expect(r.scores).toEqual(["mood"]);
  });

  it("reads the request id (x-typesafe-request-id): the caller's, or the server's own", () => {
    const r = report["typesafe-sdk"]!;
    expect(r.request_id).toBe("typesafe-req-1");
    expect(r.generated_request_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(r.generated_request_id).toBe(r.generated_header);
  });

  it("a large state goes over the wire zstd-compressed, is decoded by the server and answered", () => {
    const large = report["typesafe-sdk"]!.large as ClientReport & { request_id: string; body_bytes: number };
    expect(large.model).toBe("jev-latest");
    expect(large.request_id).toBe("typesafe-large-1");
    expect(large.usage!.input_tokens).toBeGreaterThan(1000);
    expect(large.answers!.late!.type).toBe("noul");
    expect(large.answers!.late!.noul).toBeGreaterThan(0.5);
    expect(large.answers!.topic!.choice).toBe("delivery");
    // The server's log for that request id: what arrived and what it decoded to.
    const decoded = logLines().find((l) => l.reqId === "typesafe-large-1" && l.msg === "request body decoded");
    expect(decoded, "no 'request body decoded' line for typesafe-large-1").toBeDefined();
    expect(decoded!.contentEncoding).toBe("zstd");
    expect(decoded!.bodyBytes).toBeGreaterThan(large.body_bytes);
    expect(decoded!.wireBytes as number).toBeLessThan((decoded!.bodyBytes as number) / 3);
    const done = logLines().find((l) => l.reqId === "typesafe-large-1" && l.msg === "request completed");
    expect(done).toMatchObject({ status: 200, model: "jev-latest" });
  });

  it("small bodies (under 1 KiB) are sent as they are", () => {
    const small = logLines().filter((l) => l.reqId === "typesafe-req-1");
    expect(small.map((l) => l.msg)).not.toContain("request body decoded");
    expect(small.find((l) => l.msg === "request completed")).toMatchObject({ status: 200 });
  });

  it("a 422 (on a compressed body) is TypeSafeUnprocessableEntityError with the spec's detail and request id", () => {
    const r = report["typesafe-sdk"]!;
    expect422(r, "typesafe-422");
    expect((r.error as { class: string }).class).toBe("TypeSafeUnprocessableEntityError");
    expect((r.error as { message: string }).message).toContain('unknown model "no-such-model"');
    expect(logLines().find((l) => l.reqId === "typesafe-422" && l.msg === "request body decoded")).toMatchObject({ contentEncoding: "zstd" });
  });

  it("client.models.list() reads the model names, the clients' default names among them", () => {
    expect(report["typesafe-sdk"]!.models).toEqual(expect.arrayContaining(["judge-latest", "judge-v4-max", "jev-latest", "nimble-latest"]));
  });
});

describe("bespokelabs 0.4.0", () => {
  it("answers noul, choice and score through client.nimble.system_one (api_key header, /v1/nimble/systemone) under its default name nimble-latest", () => {
    expectThreeTypes(report["bespokelabs"]!, "nimble-latest");
    expect(report["bespokelabs"]!.nouls).toEqual(["refund"]);
  });

  it("echoes the caller's x-request-id (raw response) in both id headers", () => {
    const r = report["bespokelabs"]!;
    expect(r.raw_request_id).toBe("bespoke-req-1");
    expect(r.raw_sdk_request_id).toBe("bespoke-req-1");
    expect(r.raw_parsed_model).toBe("nimble-latest");
  });

  it("a 422 is UnprocessableEntityError with the spec's body", () => {
    const r = report["bespokelabs"]!;
    expect422(r, "bespoke-422");
    expect((r.error as { class: string }).class).toBe("UnprocessableEntityError");
  });
});

describe("bespokelabs-nimble 0.1.0", () => {
  it("answers noul, choice and score through Nimble.system_one under its default name nimble-latest (its own answer checks pass)", () => {
    expectThreeTypes(report["bespokelabs-nimble"]!, "nimble-latest");
  });

  it("takes the request id from x-request-id", () => {
    const r = report["bespokelabs-nimble"]!;
    expect(r.request_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(r.request_id).toBe(r.header_request_id);
  });

  it("a 422 is APIStatusError with status and request id", () => {
    expect422(report["bespokelabs-nimble"]!, null);
  });

  it("models(), limits() and health() parse", () => {
    const r = report["bespokelabs-nimble"]!;
    expect(r.models).toEqual(expect.arrayContaining(["judge-latest", "nimble-latest"]));
    expect(r.limits).toMatchObject({ max_questions: 64, max_answers_per_question: 255, max_body_bytes: 1024 * 1024, max_concurrent_requests: 4 });
    expect(r.health).toMatchObject({ status: "ok" });
  });
});
