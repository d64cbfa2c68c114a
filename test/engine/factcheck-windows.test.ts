/**
 * Fact check with the evidence cut off (`ASSAY_FACTCHECK_EVIDENCE_TOKENS=0`,
 * the windows): a document longer than one window is read in overlapping windows, every
 * claim in every window, and each claim takes its best window. Windows are
 * set small (512 tokens) so the long document stays short.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chunkRanges } from "../../src/families/factcheck.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { RequestEnvelope, SystemOneResponse } from "../../src/validate/schema.js";
import { startEngine } from "./engine.js";

const CHUNK = 512;
const OVERLAP = 64;

let engine: EnginePipeline;

function ask(model: string, state: string, qs: Record<string, unknown>): Promise<SystemOneResponse> {
  return engine.run({ model, state, questions: qs } as RequestEnvelope, { requestId: "req-fc-windows", orgId: "test", timings: new Timings() });
}

type Detail = { raw: number; chunk: number; chunks: number; evidence?: [number, number][] };

beforeAll(async () => {
  engine = await startEngine({ ASSAY_FACTCHECK_CHUNK_TOKENS: String(CHUNK), ASSAY_FACTCHECK_CHUNK_OVERLAP: String(OVERLAP), ASSAY_FACTCHECK_EVIDENCE_TOKENS: "0" });
});

afterAll(async () => {
  await engine?.close();
});

describe("fact check in windows", () => {
  const filler = Array.from({ length: 60 }, (_, i) => `Paragraph ${i}: the committee discussed routine budget items and adjourned.`).join("\n");
  const long = `${filler}\nFinally, the committee announced that the museum will open a new wing for Roman coins in 2027.`;

  it("reads a long document in overlapping windows and finds a claim supported only at its end (judge-factcheck-max, and judge-factcheck as -max)", async () => {
    // The large build: with the 0.5B the filler's own "yes" lean (raw 0.56) outbids the window that holds
    // the claim; a content-free prior for the family was measured and not shipped (docs/experiments/fact-check.md).
    const lb = engine.build("judge-factcheck-max");
    const docTokens = lb.tokenizer.encode(long).length;
    const chunks = chunkRanges(docTokens, CHUNK, OVERLAP).length;
    expect(chunks).toBeGreaterThan(1);
    const coin = { type: "noul", instructions: "The museum will open a new wing for Roman coins." };
    const tram = { type: "noul", instructions: "The committee voted to build a tram line." };
    const res = await ask("judge-factcheck-max", long, { coin });
    const d = (res.details as Record<string, Detail>).coin!;
    expect(d.chunks).toBe(chunks);
    expect(d.chunk).toBe(chunks - 1);
    expect(d.evidence).toBeUndefined();
    // Every window is read: the document is billed in full, overlaps included.
    expect(res.usage.input_tokens).toBeGreaterThan(docTokens);
    // A second claim shares every window's read: billed its own tokens once per window, not the windows again.
    const both = await ask("judge-factcheck-max", long, { coin, tram });
    expect(both.usage.input_tokens - res.usage.input_tokens).toBeLessThan(chunks * 40);
    expect((both.details as Record<string, Detail>).coin!.raw).toBeCloseTo(d.raw, 3);
    // judge-factcheck reads a document of several windows with the large build alone: -max's answers, windows and usage.
    const base = await ask("judge-factcheck", long, { coin, tram });
    for (const q of ["coin", "tram"]) {
      const b = (base.details as Record<string, Detail & { escalated: boolean; scores: Record<string, number> }>)[q]!;
      const m = (both.details as Record<string, Detail>)[q]!;
      expect(b.escalated).toBe(false);
      expect(Object.keys(b.scores)).toEqual(["qwen2.5-coder-1.5b"]);
      expect(b.raw).toBeCloseTo(m.raw, 5);
      expect(b.chunk).toBe(m.chunk);
      expect((base.answers[q] as { noul: number }).noul).toBeCloseTo((both.answers[q] as { noul: number }).noul, 5);
    }
    expect(base.usage.input_tokens).toBe(both.usage.input_tokens);
  });
});
