/**
 * `assay batch` on the real exported model (never a stub): a small file with
 * two shared states, a malformed line and an invalid one.
 *
 * Cost: about a dozen short passes (states of ~20 tokens) plus one request
 * over HTTP; the model is loaded once for the file.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openAccounts } from "../../src/accounts/index.js";
import { buildApp } from "../../src/app.js";
import { EngineScorer } from "../../src/batch/engine-scorer.js";
import { runBatch } from "../../src/batch/runner.js";
import type { OutRecord } from "../../src/batch/records.js";
import type { Scorer } from "../../src/batch/scorer.js";
import { runCli } from "../../src/cli/index.js";
import { loadConfig } from "../../src/config/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import type { Answer, RequestEnvelope, SystemOneResponse } from "../../src/validate/schema.js";
import { startEngine } from "../engine/engine.js";
import { smallDeployment } from "../engine/engine.js";

const TOL = 0.005;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-batch-"));
let engine: EnginePipeline;
let scorer: EngineScorer;

const PARCEL = "Order 1182 arrived two weeks late and the box was crushed. I want my money back.";
const BLENDER = { review: "This blender is loud but it crushes ice in seconds.", stars: 4 };

const REQUESTS: unknown[] = [
  { id: "p1", state: PARCEL, questions: { refund: { type: "noul", instructions: "The customer asks for a refund." } } },
  {
    id: "p2",
    state: PARCEL,
    questions: {
      topic: { type: "choice", instructions: "What is the message about?", criteria: { delivery: "shipping", billing: null, product: null } },
      refund: { type: "noul", instructions: "The customer is happy." },
    },
  },
  { id: "b1", state: BLENDER, questions: { loud: { type: "noul", instructions: "The review says the blender is loud." } } },
  {
    id: "p3",
    state: PARCEL,
    questions: { mood: { type: "score", instructions: "How satisfied is the customer?", criteria: ["very unhappy", "unhappy", "neutral", "happy"] } },
  },
  { state: BLENDER, questions: { stars: { type: "score", criteria: ["bad", "ok", "good"] } } },
];
const LINES = [...REQUESTS.map((r) => JSON.stringify(r)), '{"id": "broken", "state": "no closing brace"', JSON.stringify({ id: "bad", state: "x", questions: { q: { type: "maybe" } } })];
const IN = path.join(dir, "requests.jsonl");

const read = (file: string): OutRecord[] =>
  fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as OutRecord);
const byId = (rs: OutRecord[]) => new Map(rs.map((r) => [String(r.id), r]));
const response = (r: OutRecord | undefined): SystemOneResponse => {
  if (!r || !("response" in r)) throw new Error(`not an answer: ${JSON.stringify(r)}`);
  return r.response;
};

function numbers(a: Answer): number[] {
  switch (a.type) {
    case "noul":
      return [a.noul];
    case "choice":
      return [...Object.values(a.probabilities), a.confidence];
    case "score":
      return [a.score / 10, ...Object.values(a.probabilities), a.confidence];
  }
}

/** Counts the scorer calls (pipeline requests) and the questions they carried. */
function counting(inner: Scorer): Scorer & { calls: number; questions: number } {
  const c = {
    calls: 0,
    questions: 0,
    description: inner.description,
    async score(req: RequestEnvelope, id: string) {
      c.calls++;
      c.questions += Object.keys(req.questions).length;
      return inner.score(req, id);
    },
    groupInfo: (req: RequestEnvelope) => inner.groupInfo!(req),
    close: async () => {},
  };
  return c;
}

beforeAll(async () => {
  // The CLI around the engine is what this proves: the small build reads every name here.
  engine = await startEngine(smallDeployment());
  scorer = new EngineScorer(engine, loadConfig({ ...process.env, LOG_LEVEL: "silent" }), false);
  fs.writeFileSync(IN, `${LINES.join("\n")}\n`);
});
afterAll(async () => {
  await engine?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("assay batch (in-process, real model)", () => {
  const grouped = path.join(dir, "grouped.jsonl");
  const alone = path.join(dir, "alone.jsonl");

  it("writes one line per input line; a malformed or invalid line becomes an error line", async () => {
    const s = counting(scorer);
    const r = await runBatch(s, { inFile: IN, outFile: grouped, defaultModel: "judge-latest" });
    const out = read(grouped);
    expect(out).toHaveLength(LINES.length);
    expect(new Set(out.map((o) => String(o.id)))).toEqual(new Set(["p1", "p2", "b1", "p3", "5", "6", "bad"]));
    const ids = byId(out);
    expect(ids.get("6")).toMatchObject({ line: 6, status: 422, error: { code: "INVALID_REQUEST" } });
    expect((ids.get("6") as { error: { detail: string } }).error.detail).toMatch(/line 6 is not valid JSON/);
    expect(ids.get("bad")).toMatchObject({ line: 7, status: 422 });
    for (const id of ["p1", "p2", "b1", "p3", "5"]) expect(ids.get(id)!.status).toBe(200);
    expect(Object.keys(response(ids.get("p2")).answers)).toEqual(["topic", "refund"]);
    // Three parcel requests share one pass, two blender requests another; "bad" runs alone.
    expect(s.calls).toBe(3);
    expect(r.passes).toBe(3);
    expect(r.groupedLines).toBe(5);
    expect(r.run.byStatus).toEqual({ "200": 5, "422": 2 });
  });

  it("gives the same answers as one request per line (within 0.005), and splits usage exactly", async () => {
    const s = counting(scorer);
    await runBatch(s, { inFile: IN, outFile: alone, defaultModel: "judge-latest", group: false });
    expect(s.calls).toBe(6); // every valid-envelope line on its own
    const g = byId(read(grouped));
    const a = byId(read(alone));
    expect(a.get("bad")).toEqual(g.get("bad")); // the same error either way
    for (const id of ["p1", "p2", "b1", "p3", "5"]) {
      const ga = response(g.get(id)).answers;
      const aa = response(a.get(id)).answers;
      expect(Object.keys(ga)).toEqual(Object.keys(aa));
      for (const [qid, ans] of Object.entries(aa)) {
        const x = numbers(ans);
        const y = numbers(ga[qid]!);
        expect(y).toHaveLength(x.length);
        x.forEach((v, i) => expect(Math.abs(v - y[i]!)).toBeLessThan(TOL));
        if (ans.type === "choice" && ga[qid]!.type === "choice") expect(ga[qid]!.choice).toBe(ans.choice);
      }
    }
    // Usage: the first request of a group is charged what it is charged alone
    // (prefix + its questions); the others their questions only; no double count.
    const tok = (m: Map<string, OutRecord>, id: string) => response(m.get(id)).usage.input_tokens;
    expect(tok(g, "p1")).toBe(tok(a, "p1"));
    expect(tok(g, "b1")).toBe(tok(a, "b1"));
    const prefixOf = (state: RequestEnvelope["state"]) =>
      scorer.groupInfo({ model: "judge-latest", state, questions: { q: { type: "noul" } } })!.prefixTokens;
    const prefixParcel = prefixOf(PARCEL);
    const prefixBlender = prefixOf(BLENDER);
    expect(tok(g, "p2")).toBe(tok(a, "p2") - prefixParcel);
    expect(tok(g, "p3")).toBe(tok(a, "p3") - prefixParcel);
    expect(tok(g, "5")).toBe(tok(a, "5") - prefixBlender);
    // The shares add up to what one merged request is charged.
    const merged = await engine.run(
      {
        model: "judge-latest",
        state: PARCEL,
        questions: Object.fromEntries(
          ["p1", "p2", "p3"].flatMap((id, k) =>
            Object.entries((REQUESTS.find((r) => (r as { id?: string }).id === id) as RequestEnvelope).questions).map(([q, v]) => [`${k}:${q}`, v]),
          ),
        ),
      },
      { requestId: "t", orgId: "t", timings: new (await import("../../src/pipeline/timings.js")).Timings() },
    );
    expect(tok(g, "p1") + tok(g, "p2") + tok(g, "p3")).toBe(merged.usage.input_tokens);
  });

  it("resumes: skips ids already written, and reruns a cut last line", async () => {
    const resumed = path.join(dir, "resumed.jsonl");
    const all = fs.readFileSync(grouped, "utf8").split("\n").filter(Boolean);
    // Keep the error lines and two answers, then half of a third answer (an interrupted write).
    const errors = all.filter((l) => l.includes('"status":422'));
    const answers = all.filter((l) => l.includes('"status":200'));
    const keptIds = answers.slice(0, 2).map((l) => String((JSON.parse(l) as OutRecord).id));
    fs.writeFileSync(resumed, `${[...errors, ...answers.slice(0, 2)].join("\n")}\n${answers[2]!.slice(0, 50)}`);
    const s = counting(scorer);
    const r = await runBatch(s, { inFile: IN, outFile: resumed, defaultModel: "judge-latest" });
    expect(r.skipped).toBe(errors.length + 2);
    expect(r.truncatedBytes).toBe(50);
    expect(r.run.records).toBe(3);
    const out = read(resumed);
    expect(out).toHaveLength(LINES.length);
    expect(new Set(out.map((o) => String(o.id))).size).toBe(LINES.length);
    // Only the three missing requests went to the model.
    const missing = REQUESTS.map((x, i) => String((x as { id?: string }).id ?? i + 1)).filter((id) => !keptIds.includes(id));
    expect(missing).toHaveLength(3);
    expect(s.questions).toBe(
      missing.reduce((n, id) => n + Object.keys(response(byId(read(grouped)).get(id)).answers).length, 0),
    );
    // A second run has nothing to do.
    const again = counting(scorer);
    const r2 = await runBatch(again, { inFile: IN, outFile: resumed, defaultModel: "judge-latest" });
    expect(again.calls).toBe(0);
    expect(r2.run.records).toBe(0);
    expect(read(resumed)).toHaveLength(LINES.length);
  });

  it("runs from the command line against a server (--url, Bearer key) with a summary", async () => {
    const dataDir = path.join(dir, "state");
    fs.mkdirSync(dataDir);
    const config = loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_DATA_DIR: dataDir });
    const accounts = await openAccounts(config);
    const { key } = await accounts.createKey("batch-test");
    const app = buildApp({ config, pipeline: engine, accounts });
    await app.listen({ port: 0, host: "127.0.0.1" });
    try {
      const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
      const out = path.join(dir, "http.jsonl");
      let stdout = "";
      let stderr = "";
      const code = await runCli(["node", "assay", "batch", "--in", IN, "--out", out, "--url", url, "--key", key, "--concurrency", "2"], {
        stdout: (t) => (stdout += t),
        stderr: (t) => (stderr += t),
        env: { ...process.env, LOG_LEVEL: "silent", ASSAY_DATA_DIR: dataDir },
      });
      expect(code, stderr).toBe(0);
      const recs = byId(read(out));
      expect(recs.size).toBe(LINES.length);
      const g = byId(read(grouped));
      for (const id of ["p1", "p2", "b1", "p3", "5"]) {
        const x = Object.values(response(recs.get(id)).answers).flatMap(numbers);
        const y = Object.values(response(g.get(id)).answers).flatMap(numbers);
        x.forEach((v, i) => expect(Math.abs(v - y[i]!)).toBeLessThan(TOL));
      }
      expect(recs.get("bad")).toMatchObject({ status: 422 });
      expect(stdout).toMatch(/^batch: 7 input lines; 0 already in http\.jsonl/m);
      expect(stdout).toMatch(/status \(this run\): 200 × 5, 422 × 2/);
      expect(stdout).toMatch(/^input tokens: [\d,]+ this run/m);
      expect(stdout).toMatch(/^cost: /m);
      expect(stderr).toMatch(/lines\/s/);
    } finally {
      await app.close();
      await accounts.close();
    }
  });
});
