/**
 * The readout study's reads (src/eval/study.ts) on the real 0.5B build: every
 * content-free read carries the name of the variant that asked it, also when
 * two variants ask the very same text (a question's `question_ctx` and
 * `auto`, whose shared read once lost `question_ctx`'s name), and
 * `variants` reads only the variants named.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { passLimit } from "../../src/engine/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import type { Dataset } from "../../src/eval/datasets.js";
import { collectStudy, NEUTRAL_STATES } from "../../src/eval/study.js";
import { readouts, readoutName, score } from "../../src/eval/study-report.js";
import { scheduledLargeConfig, startEngine } from "./engine.js";

let engine: EnginePipeline;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-study-"));

beforeAll(async () => {
  engine = await startEngine({ ASSAY_MODELS_CONFIG: scheduledLargeConfig() });
});

afterAll(async () => {
  await engine?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

const dataset: Dataset = {
  name: "noul_study_test",
  file: "inline",
  format: "noul",
  task: "noul",
  totalRows: 2,
  items: [
    { type: "noul", id: "q", state: "The parcel reached Oslo on Monday.", question: { type: "noul", instructions: "Did the parcel reach Oslo?" }, gold: true },
    { type: "noul", id: "s", state: "The parcel reached Oslo on Monday.", question: { type: "noul", instructions: "The parcel is lost." }, gold: false },
  ],
};

describe("readout study reads (real 0.5B build)", () => {
  it("names every content-free read after the variant that asked it; the shared text reads alike", async () => {
    const lb = engine.build("vendor/judge-9B");
    const rows = await collectStudy(dataset, path.join(dir, "all.jsonl"), { lb, engine: engine.engine, maxTokens: passLimit(lb, 8192), before: false });
    expect(rows).toHaveLength(2);
    for (const row of rows) {
      for (const neutral of NEUTRAL_STATES) {
        expect(row.cf[neutral]!.map((b) => b.v)).toEqual(row.branches.map((b) => b.v));
      }
    }
    // For the question, question_ctx and auto ask the same text: the same read under two names.
    const q = rows.find((r) => r.id === "q")!;
    const cf = q.cf[""]!;
    expect(cf.find((b) => b.v === "question_ctx")!.lps).toEqual(cf.find((b) => b.v === "auto")!.lps);
    // And the readouts that subtract question_ctx's prior exist (they were missing before).
    const r = readouts(rows).find((x) => readoutName(x) === "question_ctx −1·cf(empty)");
    expect(r).toBeDefined();
    expect(score(rows, r!)).not.toBeNull();
    // Each row knows its form, and the served readout with the questions' prior weighed apart changes
    // the question's score only: the statement keeps weight 1.
    expect(rows.map((x) => [x.id, x.statement])).toEqual([
      ["q", false],
      ["s", true],
    ]);
    const byName = (n: string) => score(rows, readouts(rows).find((x) => readoutName(x) === n)!)!.scores;
    const served = byName("question_ctx+auto −1·cf(empty)");
    const apart = byName("question_ctx+auto −1·cf(empty), questions −0");
    const none = byName("question_ctx+auto");
    expect(apart[0]).toEqual(none[0]);
    expect(apart[1]).toEqual(served[1]);
    expect(apart[0]).not.toEqual(served[0]);
  });

  it("reads only the variants named", async () => {
    const lb = engine.build("vendor/judge-9B");
    const rows = await collectStudy(dataset, path.join(dir, "subset.jsonl"), {
      lb,
      engine: engine.engine,
      maxTokens: passLimit(lb, 8192),
      before: false,
      variants: new Set(["question_ctx", "yn_num"]),
    });
    for (const row of rows) {
      expect(new Set(row.branches.map((b) => b.v))).toEqual(new Set(["question_ctx", "yn_num"]));
      // yn_num: the two answers in both orders, read as numbers "1" and "2".
      expect(row.branches.filter((b) => b.v === "yn_num").map((b) => b.option)).toEqual([
        [0, 1],
        [1, 0],
      ]);
    }
  });
});
