/**
 * Code search requests built like the dev data (`../shared/data/code_search.jsonl`: ~30 items, ~11k
 * input tokens each) on every code search name, against a real server with both builds loaded and
 * the default deadlines: each request alone, then two at a time. Every one must be answered 200:
 * deadlines by work give a request the time its own estimated work needs (issue 14), where a fixed
 * 60 s deadline gave `judge-codegrep-max` a 504 on an idle server. p50 per name is recorded.
 *
 * Hours of model work on a CPU (57 rows × 3 names × 2 modes), so it runs only when asked:
 *
 *   ASSAY_RELIABILITY_CODESEARCH=1 npx vitest run test/reliability/codesearch-dev.test.ts
 *   ASSAY_RELIABILITY_CODESEARCH_LIMIT=6        rows, spread evenly over the file (default: all)
 *   ASSAY_RELIABILITY_CODESEARCH_NAMES=judge-codegrep-lite,judge-codegrep   (default: the three)
 *   ASSAY_RELIABILITY_CODESEARCH_MODES=alone    or pairs (default: both)
 *   ASSAY_RELIABILITY_CODESEARCH_ROWS=20:40     only these of the rows chosen (a slice, end excluded)
 *
 * The last two let one name's run (over two hours for `judge-codegrep-max` on the whole file) be
 * taken in several sittings.
 *
 * Each answer is recorded as it comes (recordFigures, test `codesearch-dev-request`, in
 * `.cache/reliability/<form>.jsonl`), so a run cut short keeps the rows it read.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { ROOT } from "../../src/config/index.js";
import { ServerProcess, percentile, recordFigures, score } from "./harness.js";

const ON = process.env.ASSAY_RELIABILITY_CODESEARCH === "1";
const DATA = path.join(ROOT, "..", "shared", "data", "code_search.jsonl");
const NAMES = (process.env.ASSAY_RELIABILITY_CODESEARCH_NAMES ?? "judge-codegrep-lite,judge-codegrep,judge-codegrep-max").split(",");
const MODES = new Set((process.env.ASSAY_RELIABILITY_CODESEARCH_MODES ?? "alone,pairs").split(","));

interface Row {
  id: string;
  query: string;
  items: { id: string }[];
}

function rows(): Row[] {
  const all = fs.readFileSync(DATA, "utf8").trim().split("\n").map((l) => JSON.parse(l) as Row);
  const limit = Number(process.env.ASSAY_RELIABILITY_CODESEARCH_LIMIT ?? all.length);
  const spread = limit >= all.length ? all : Array.from({ length: limit }, (_, i) => all[Math.floor((i * all.length) / limit)]!);
  const [from, to] = (process.env.ASSAY_RELIABILITY_CODESEARCH_ROWS ?? "0:").split(":");
  return spread.slice(Number(from || 0), to ? Number(to) : undefined);
}

const body = (model: string, r: Row) => ({
  model,
  state: { query: r.query, items: r.items },
  questions: Object.fromEntries(r.items.map((it) => [`q${it.id.slice(1)}`, { type: "noul" }])),
});

let dir: string;
let server: ServerProcess | null = null;
let key = "";

describe.skipIf(!ON)("code search dev requests on every name, alone and two at a time", () => {
  beforeAll(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-codesearch-"));
    const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
    key = store.createKey("dev").key;
    store.addCredit("dev", "purchase", 100_000_000, "code search dev run", Date.now());
    store.close();
    // Both builds loaded from the start when a name needs the large one: no 503 while it loads.
    const schedule = NAMES.every((n) => n === "judge-codegrep-lite") ? "never" : "always";
    server = await ServerProcess.start({ ASSAY_DATA_DIR: dir, ASSAY_MODEL_SCHEDULE: schedule, LOG_LEVEL: "info" });
  }, 600_000);

  afterAll(async () => {
    await server?.stop();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  for (const model of NAMES) {
    it(
      `${model}: every request 200, alone and in pairs`,
      async () => {
        const rs = rows();
        type Answer = { id: string; status: number; ms: number; detail?: unknown; deadline: number };
        const answer = (mode: string, id: string, res: Awaited<ReturnType<typeof score>>): Answer => {
          const a = { id, status: res.status, ms: res.ms, detail: (res.json as { detail?: unknown } | null)?.detail, deadline: Number(res.headers.get("x-deadline-time")) };
          recordFigures("codesearch-dev-request", { model, mode, ...a });
          return a;
        };
        const alone: Answer[] = [];
        if (MODES.has("alone")) for (const r of rs) alone.push(answer("alone", r.id, await score(server!.url, key, body(model, r))));
        const pairs: Answer[] = [];
        if (MODES.has("pairs"))
          for (let i = 0; i < rs.length; i += 2) {
            const two = rs.slice(i, i + 2);
            const out = await Promise.all(two.map((r) => score(server!.url, key, body(model, r))));
            out.forEach((res, k) => pairs.push(answer("pairs", two[k]!.id, res)));
          }
        const summary = (xs: Answer[]) =>
          xs.length === 0 ? null : { p50ms: Math.round(percentile(xs.map((o) => o.ms), 50)), maxms: Math.round(Math.max(...xs.map((o) => o.ms))), statuses: count(xs) };
        const figures = {
          model,
          rows: rs.length,
          alone: summary(alone),
          pairs: summary(pairs),
          deadlineP50ms: Math.round(percentile([...alone, ...pairs].map((o) => o.deadline), 50)),
        };
        recordFigures("codesearch-dev", figures);
        expect(alone.length + pairs.length).toBe(rs.length * MODES.size);
        expect([...alone, ...pairs].filter((o) => o.status !== 200).map((o) => `${o.id} ${o.status} ${JSON.stringify(o.detail)}`)).toEqual([]);
      },
      24 * 3_600_000,
    );
  }
});

function count(xs: { status: number }[]): Record<number, number> {
  const out: Record<number, number> = {};
  for (const x of xs) out[x.status] = (out[x.status] ?? 0) + 1;
  return out;
}
