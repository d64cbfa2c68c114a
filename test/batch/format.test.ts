/**
 * Batch file handling without the model: input lines → requests or error
 * records, resuming from an output file with a cut last line, and the exact
 * usage split of a grouped response.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseInput } from "../../src/batch/input.js";
import { isDone, readExisting } from "../../src/batch/output.js";
import { splitGroup } from "../../src/batch/runner.js";
import type { SystemOneResponse } from "../../src/validate/schema.js";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-batch-format-"));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const q = { q: { type: "noul", instructions: "x" } };

describe("input lines", () => {
  it("gives every non-blank line a request or a 4xx error, ids from the line or its number", () => {
    const text = [
      JSON.stringify({ id: "a", state: "s", questions: q }),
      "",
      JSON.stringify({ state: "s", questions: q, model: "judge-v4" }),
      "{not json",
      "[1,2]",
      JSON.stringify({ id: 1.5, state: "s", questions: q }),
      JSON.stringify({ id: "b", questions: q }),
      JSON.stringify({ id: "a", state: "again", questions: q }),
      JSON.stringify({ id: "c", state: "s", questions: q, extra: 1 }),
      "   ",
    ].join("\n");
    const lines = parseInput(text, "judge-latest");
    expect(lines.map((l) => [l.line, l.id, l.error?.status ?? 200])).toEqual([
      [1, "a", 200],
      [3, 3, 200],
      [4, 4, 422],
      [5, 5, 422],
      [6, 6, 422],
      [7, "b", 422],
      [8, "a", 422],
      [9, "c", 200],
    ]);
    expect(lines[0]!.request!.model).toBe("judge-latest"); // --model fills a missing model
    expect(lines[1]!.request!.model).toBe("judge-v4"); // a line's own model wins
    expect(lines[2]!.error!.detail).toMatch(/line 4 is not valid JSON/);
    expect(lines[5]!.error!.detail).toMatch(/^state: /);
    expect(lines[6]!.error!.code).toBe("DUPLICATE_ID");
    // Unknown top-level fields are ignored, as on the HTTP route.
    expect(lines[7]!.request).not.toHaveProperty("extra");
  });

  it("refuses a line over 1 MiB with 413 and forbidden prototype keys with 422", () => {
    const big = JSON.stringify({ state: "x".repeat(1024 * 1024), questions: q });
    const poisoned = `{"state":"s","questions":{"__proto__":{"type":"noul"}}}`;
    const [a, b] = parseInput(`${big}\n${poisoned}`, "judge-latest");
    expect(a!.error!.status).toBe(413);
    expect(b!.error!.status).toBe(422);
    expect(b!.error!.detail).toMatch(/__proto__/);
  });
});

describe("resuming", () => {
  it("cuts a partial last line, and knows which ids (and duplicate lines) are done", () => {
    const file = path.join(dir, "out.jsonl");
    const rec = (id: string | number, line: number) =>
      JSON.stringify({ id, line, status: 200, response: { model: "m", answers: {}, usage: { input_tokens: 10, output_tokens: 0 } } });
    const dup = JSON.stringify({ id: "a", line: 8, status: 422, error: { detail: "duplicate", code: "DUPLICATE_ID" } });
    const whole = `${rec("a", 1)}\n${rec(3, 3)}\n${dup}\nnot a record\n`;
    fs.writeFileSync(file, `${whole}{"id":"b","line":7,"sta`);
    const ex = readExisting(file);
    expect(fs.readFileSync(file, "utf8")).toBe(whole);
    expect(ex.truncatedBytes).toBe(`{"id":"b","line":7,"sta`.length);
    expect(ex.invalidLines).toBe(1);
    expect(ex.tally).toEqual({ records: 3, byStatus: { "200": 2, "422": 1 }, inputTokens: 20 });
    const lines = parseInput(
      [
        JSON.stringify({ id: "a", state: "s", questions: q }),
        "x",
        JSON.stringify({ state: "s", questions: q }),
        JSON.stringify({ id: "3", state: "s", questions: q }),
        "",
        "",
        JSON.stringify({ id: "b", state: "s", questions: q }),
        JSON.stringify({ id: "a", state: "s", questions: q }),
        JSON.stringify({ id: "a", state: "s", questions: q }),
      ].join("\n"),
      "judge-latest",
    );
    expect(lines.map((l) => `${String(l.id)}@${l.line}:${isDone(ex, l)}`)).toEqual([
      "a@1:true",
      "2@2:false",
      "3@3:true", // the line number 3 is done
      "3@4:false", // the string "3" is another id
      "b@7:false",
      "a@8:true", // its duplicate-id record is there
      "a@9:false",
    ]);
  });
});

describe("splitting a grouped response", () => {
  it("gives the first request the shared prefix and the others their own questions; the sum is exact", () => {
    const lines = parseInput(
      [
        JSON.stringify({ id: "x", state: "s", questions: { a: { type: "noul" }, b: { type: "noul" } } }),
        JSON.stringify({ id: "y", state: "s", questions: { a: { type: "noul" } } }),
      ].join("\n"),
      "judge-latest",
    );
    const info = (questionTokens: number) => ({
      key: "k",
      questions: 1,
      prefixTokens: 50,
      questionTokens,
      blockTokens: questionTokens + 2,
      maxPackedTokens: 8192,
    });
    const members = [
      { input: lines[0] as never, info: info(30) },
      { input: lines[1] as never, info: info(12) },
    ];
    const noul = (p: number) => ({ type: "noul" as const, noul: p });
    const response: SystemOneResponse = {
      model: "judge-latest",
      answers: { "0:a": noul(0.1), "0:b": noul(0.2), "1:a": noul(0.3) },
      usage: { input_tokens: 50 + 30 + 12, output_tokens: 0 },
    };
    const [rx, ry] = splitGroup(members, response);
    expect(rx).toMatchObject({ id: "x", status: 200, response: { answers: { a: noul(0.1), b: noul(0.2) }, usage: { input_tokens: 80 } } });
    expect(ry).toMatchObject({ id: "y", status: 200, response: { answers: { a: noul(0.3) }, usage: { input_tokens: 12 } } });
    expect(Object.keys((ry as { response: SystemOneResponse }).response.answers)).toEqual(["a"]);
  });
});
