/**
 * Fact check on the real engine (small and large exported builds), with the
 * evidence cut (the served default) for documents longer than one window. Chunks are set small
 * here (512 tokens) so a long-document test stays short; the served defaults
 * are in the README.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AssayError } from "../../src/errors/catalogue.js";
import { DEFAULT_BAND } from "../../src/families/escalation.js";
import { chunkRanges } from "../../src/families/factcheck.js";
import { FactCheckFit, familyFit } from "../../src/families/types.js";
import { encodeBranches, scoreYesNo, yesProbability } from "../../src/families/yesno.js";
import { logit } from "../../src/probability/calibration.js";
import { factcheckClaim, factcheckClaimTrueFalse, factcheckPrefixParts } from "../../src/prompt/families.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { RequestEnvelope, SystemOneResponse } from "../../src/validate/schema.js";
import { scheduledLargeConfig, startEngine } from "./engine.js";

const SMALL = "qwen2.5-coder-0.5b";
const LARGE = "qwen2.5-coder-1.5b";
const CHUNK = 512;
const OVERLAP = 64;

let engine: EnginePipeline;

const doc =
  "The Harbor Street bridge reopened on 14 May 2024 after an eighteen-month renovation. The project cost " +
  "32 million dollars, paid by the state transport fund. The new deck has two bicycle lanes and a footpath on each side.";

function ask(model: string, state: unknown, qs: Record<string, unknown>): Promise<SystemOneResponse> {
  return engine.run({ model, state, questions: qs } as RequestEnvelope, { requestId: "req-fc", orgId: "test", timings: new Timings() });
}

async function status(model: string, state: unknown, qs: Record<string, unknown>): Promise<[number, string]> {
  try {
    await ask(model, state, qs);
  } catch (e) {
    expect(e).toBeInstanceOf(AssayError);
    return [(e as AssayError).status, (e as AssayError).message];
  }
  throw new Error("expected an error");
}

type Detail = { raw: number; escalated: boolean; scores: Record<string, number>; chunk: number; chunks: number; evidence?: [number, number][] };

/** The same claims asked of two names, one after the other: each response and its details. */
async function askBoth(first: string, second: string, state: string, qs: Record<string, unknown>) {
  const a = await ask(first, state, qs);
  const b = await ask(second, state, qs);
  return [a, a.details as Record<string, Detail>, b, b.details as Record<string, Detail>] as const;
}

beforeAll(async () => {
  engine = await startEngine({
    ASSAY_MODELS_CONFIG: scheduledLargeConfig(),
    ASSAY_FACTCHECK_CHUNK_TOKENS: String(CHUNK),
    ASSAY_FACTCHECK_CHUNK_OVERLAP: String(OVERLAP),
    // The served default, clamped to one window here (`0`, the windows: factcheck-windows.test.ts).
    ASSAY_FACTCHECK_EVIDENCE_TOKENS: "1024",
  });
});

afterAll(async () => {
  await engine?.close();
});

describe("fact check", () => {
  it("scores each claim against the document (judge-factcheck-lite)", async () => {
    const res = await ask("judge-factcheck-lite", doc, {
      yes: { type: "noul", instructions: "The bridge reopened in May 2024." },
      no: { type: "noul", instructions: "The renovation was paid for by a private company." },
    });
    expect(res.request_id).toBe("req-fc");
    const p = (q: string) => (res.answers[q] as { noul: number }).noul;
    expect(p("yes")).toBeGreaterThan(p("no"));
    const d = res.details as Record<string, Detail>;
    expect(d.yes).toMatchObject({ escalated: false, chunk: 0, chunks: 1 });
    expect(Object.keys(d.yes!.scores)).toEqual([SMALL]);
  });

  it("bills the document prefix once and each claim once when the document is one chunk", async () => {
    const claims = ["The bridge has bicycle lanes.", "The bridge is closed."];
    const res = await ask("judge-factcheck-lite", doc, { a: { type: "noul", instructions: claims[0] }, b: { type: "noul", instructions: claims[1] } });
    const lb = engine.build("judge-factcheck-lite");
    const { head, tail } = factcheckPrefixParts(lb.style);
    const enc = (t: string) => lb.tokenizer.encode(t).length;
    // The one window is encoded with the text around it (as the general prefix); the true/false readings are not billed.
    const expected = enc(`${head}${doc}${tail}`) + claims.reduce((s, c) => s + enc(factcheckClaim(lb.style, c)), 0);
    expect(res.usage.input_tokens).toBe(expected);
  });

  it("refuses what is not a fact check request with 422", async () => {
    expect(await status("judge-factcheck-lite", { doc }, { a: { type: "noul", instructions: "x" } })).toEqual([
      422,
      expect.stringMatching(/document, as a string/),
    ]);
    expect(await status("judge-factcheck-lite", doc, { a: { type: "noul" } })).toEqual([422, "questions.a.instructions: a fact check question needs its claim in `instructions`"]);
    expect((await status("judge-factcheck-lite", doc, { a: { type: "noul", instructions: "  " } }))[1]).toMatch(/claim/);
    expect(await status("judge-factcheck-lite", doc, { a: { type: "choice", criteria: { x: null, y: null } } })).toEqual([
      422,
      "questions.a.type: fact check questions are of type noul, one claim each in `instructions`",
    ]);
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`c${i}`, { type: "noul", instructions: "x" }]));
    expect((await status("judge-factcheck-lite", doc, many))[1]).toMatch(/1 to 64/);
  });

  it("judge-factcheck-max needs the large build: 503 while it starts, then answers", async () => {
    const [code, detail] = await status("judge-factcheck-max", doc, { a: { type: "noul", instructions: "The project cost 32 million dollars." } });
    expect(code).toBe(503);
    expect(detail).toMatch(/starting/);
    await engine.lifecycle.load(LARGE);
    const res = await ask("judge-factcheck-max", doc, {
      a: { type: "noul", instructions: "The project cost 32 million dollars." },
      b: { type: "noul", instructions: "The project cost 90 million dollars." },
    });
    const p = (q: string) => (res.answers[q] as { noul: number }).noul;
    expect(p("a")).toBeGreaterThan(p("b"));
    expect(Object.keys((res.details as Record<string, Detail>).a!.scores)).toEqual([LARGE]);
  });

  const filler = Array.from({ length: 60 }, (_, i) => `Paragraph ${i}: the committee discussed routine budget items and adjourned.`).join("\n");
  const long = `${filler}\nFinally, the committee announced that the museum will open a new wing for Roman coins in 2027.`;

  it("reads a document of several windows from each claim's evidence cut, exactly as that cut asked as the document (judge-factcheck-max)", async () => {
    // The large build (loaded by the test above): the claim is supported only by the document's last line.
    const lb = engine.build("judge-factcheck-max");
    const chunks = chunkRanges(lb.tokenizer.encode(long).length, CHUNK, OVERLAP).length;
    expect(chunks).toBeGreaterThan(1);
    const qs = {
      coin: { type: "noul", instructions: "The museum will open a new wing for Roman coins." },
      tram: { type: "noul", instructions: "The committee voted to build a tram line." },
    };
    const res = await ask("judge-factcheck-max", long, qs);
    const d = res.details as Record<string, Detail>;
    for (const q of ["coin", "tram"]) {
      expect(d[q]!.chunks).toBe(chunks);
      expect(d[q]!.chunk).toBe(0);
      // One passage: a single range of the document.
      expect(d[q]!.evidence!.length).toBe(1);
    }
    // The coin claim's cut holds the one line that supports it.
    const cut = (q: string) => d[q]!.evidence!.map(([a, b]) => long.slice(a, b)).join("\n");
    expect(cut("coin")).toContain("Roman coins in 2027");
    // A passage: the document's own slice, ending at that line (nothing after it matches), within one window.
    expect(long.endsWith(cut("coin"))).toBe(true);
    expect(lb.tokenizer.encode(cut("coin")).length).toBeLessThanOrEqual(CHUNK);
    // Each claim is read against its cut as if the cut were the whole (one-window) document: same prefix, same answer.
    let billed = 0;
    for (const q of ["coin", "tram"] as const) {
      const alone = await ask("judge-factcheck-max", cut(q), { [q]: qs[q] });
      const a = (alone.details as Record<string, Detail>)[q]!;
      expect(a.chunks).toBe(1);
      expect(a.evidence).toBeUndefined();
      expect(d[q]!.raw).toBeCloseTo(a.raw, 5);
      expect((res.answers[q] as { noul: number }).noul).toBeCloseTo((alone.answers[q] as { noul: number }).noul, 5);
      billed += alone.usage.input_tokens;
      expect(alone.usage.input_tokens).toBeLessThan(lb.tokenizer.encode(long).length);
    }
    // Billed for what was read: each claim's cut and the claim, not the document.
    expect(res.usage.input_tokens).toBe(billed);
    expect((res.answers.coin as { noul: number }).noul).toBeGreaterThan((res.answers.tram as { noul: number }).noul);
  });

  it("claims whose cuts are the same text share one read of it", async () => {
    // Both claims match only the last line, so both cuts are the same passage ending there: one prefix, billed once.
    const qs = {
      a: { type: "noul", instructions: "Roman coins will be shown in the new museum wing." },
      b: { type: "noul", instructions: "The museum wing for Roman coins opens in 2027." },
    };
    const res = await ask("judge-factcheck-max", long, qs);
    const d = res.details as Record<string, Detail>;
    expect(d.a!.evidence).toEqual(d.b!.evidence);
    const cut = d.a!.evidence!.map(([x, y]) => long.slice(x, y)).join("\n");
    const alone = await ask("judge-factcheck-max", cut, qs);
    expect(res.usage.input_tokens).toBe(alone.usage.input_tokens);
    for (const q of ["a", "b"]) expect((alone.details as Record<string, Detail>)[q]!.raw).toBeCloseTo(d[q]!.raw, 5);
  });

  it("judge-factcheck reads a document of several windows with the large build alone, as judge-factcheck-max does", async () => {
    const qs = {
      coin: { type: "noul", instructions: "The museum will open a new wing for Roman coins." },
      tram: { type: "noul", instructions: "The committee voted to build a tram line." },
    };
    const [max, md, base, bd] = await askBoth("judge-factcheck-max", "judge-factcheck", long, qs);
    for (const q of ["coin", "tram"]) {
      expect(bd[q]!.chunks).toBeGreaterThan(1);
      // Read as -max reads it: not escalated (no smaller build scored it first) and no small-build score.
      expect(bd[q]!.escalated).toBe(md[q]!.escalated);
      expect(Object.keys(bd[q]!.scores)).toEqual([LARGE]);
      expect((base.answers[q] as { noul: number }).noul).toBeCloseTo((max.answers[q] as { noul: number }).noul, 5);
      expect(bd[q]!.raw).toBeCloseTo(md[q]!.raw, 5);
      expect(bd[q]!.chunk).toBe(md[q]!.chunk);
      expect(bd[q]!.evidence).toEqual(md[q]!.evidence);
    }
    // Billed for what was read: the large build's reading, once.
    expect(base.usage.input_tokens).toBe(max.usage.input_tokens);
  });

  it("reads a statement twice, as the general family does: the mean log-odds of its yes/no and true/false readings", async () => {
    const lb = engine.build("judge-factcheck-lite");
    const claim = "The bridge reopened in May 2024.";
    // Without a content-free prior (tested below), the raw score is the two readings' alone.
    const shipped = lb.build.manifest.calibration;
    lb.build.manifest.calibration = shipped ? { ...shipped, prior: {} } : shipped;
    let raw: number;
    try {
      const res = await ask("judge-factcheck-lite", doc, { c: { type: "noul", instructions: claim } });
      raw = (res.details as Record<string, Detail>).c!.raw;
    } finally {
      lb.build.manifest.calibration = shipped;
    }
    const { head, tail } = factcheckPrefixParts(lb.style);
    // A one-window document is tokenized with the text around it, as the general prefix is.
    const prefix = lb.tokenizer.encode(`${head}${doc}${tail}`);
    // The two readings are one question's presentations: one block behind their stem (pack.ts).
    const both = encodeBranches(lb, prefix, [factcheckClaim(lb.style, claim), factcheckClaimTrueFalse(lb.style, claim)]);
    for (const b of both.branches) b.group = 0;
    const r = await scoreYesNo(engine.engine, lb, both, 8192, { timings: new Timings() } as never);
    const [yesNo, trueFalse] = [r.p[0]!, r.p[1]!];
    expect(Math.abs(logit(yesNo) - logit(trueFalse))).toBeGreaterThan(1e-3);
    expect(logit(raw)).toBeCloseTo((logit(yesNo) + logit(trueFalse)) / 2, 3);
  });

  it("without a fit of its own, reads a one-window claim exactly as the general judge reads \"The document supports this claim: …\" (prior and map included)", async () => {
    const claims = ["The bridge reopened in May 2024.", "The renovation was paid for by the city.", "Does the new deck have bicycle lanes?"];
    const fam = await ask("judge-factcheck-lite", doc, Object.fromEntries(claims.map((c, i) => [`c${i}`, { type: "noul", instructions: c }])));
    // scheduledLargeConfig() moves the general names onto the small build: the same weights and fit.
    const gen = await ask(
      "judge-latest",
      doc,
      Object.fromEntries(claims.map((c, i) => [`c${i}`, { type: "noul", instructions: `The document supports this claim: ${c}` }])),
    );
    const lb = engine.build("judge-factcheck-lite");
    expect(lb.build.manifest.calibration?.platt?.["factcheck:noul"]).toBeUndefined();
    claims.forEach((_, i) => {
      const f = fam.answers[`c${i}`] as { noul: number };
      const g = gen.answers[`c${i}`] as { noul: number };
      expect(f.noul).toBeCloseTo(g.noul, 5);
    });
    // Not a constant: the three claims get different answers.
    expect(new Set(claims.map((_, i) => (fam.answers[`c${i}`] as { noul: number }).noul.toFixed(3))).size).toBe(3);
  });

  it("takes the content-free prior in the build's fit off each claim's score: weight × its log-odds against the neutral document", async () => {
    const lb = engine.build("judge-factcheck-lite");
    const m = lb.build.manifest;
    const shipped = m.calibration;
    const claim = "The new deck has a footpath on each side.";
    const withPrior = async (prior: { weight: number; state: string }) => {
      const cal = { ...((shipped ?? { build_hash: m.build_hash, fitted_at: "", temperatures: {} }) as Record<string, unknown>) };
      cal["factcheck"] = { ...((cal["factcheck"] as object | undefined) ?? {}), prior };
      m.calibration = cal as typeof shipped;
      const res = await ask("judge-factcheck-lite", doc, { c: { type: "noul", instructions: claim } });
      return (res.details as Record<string, Detail>).c!.raw;
    };
    try {
      const plain = await withPrior({ weight: 0, state: "" });
      const corrected = await withPrior({ weight: 0.5, state: "" });
      // The claim is a statement, so it is read twice (yes/no and true/false) against the neutral document too.
      const branches = encodeBranches(lb, [], [factcheckClaim(lb.style, claim), factcheckClaimTrueFalse(lb.style, claim)]).branches;
      // The family's own reading: the prior cache's entry in the partition of the organization `ask`
      // charges. (Read apart, as here, the yes/no reading differs from the family's one-block reading by
      // up to 0.1 in log-probability: the int8 graph's rounding, not the layout; docs/experiments/int8-and-gpu.md.)
      const neutral = await engine.engine.prior(lb, "", branches, 8192, { orgId: "test" });
      const lean = (logit(yesProbability(neutral[0]!)) + logit(yesProbability(neutral[1]!))) / 2;
      expect(Math.abs(lean)).toBeGreaterThan(0.01);
      expect(logit(corrected)).toBeCloseTo(logit(plain) - 0.5 * lean, 4);
    } finally {
      m.calibration = shipped;
    }
  });

  it("judge-factcheck escalates exactly the claims the small build is unsure about", async () => {
    const qs = {
      a: { type: "noul", instructions: "The bridge reopened in May 2024." },
      b: { type: "noul", instructions: "The renovation took eighteen months." },
      c: { type: "noul", instructions: "The bridge carries a tram line." },
    };
    const [lite, ld, base, bd] = await askBoth("judge-factcheck-lite", "judge-factcheck", doc, qs);
    const band = familyFit(engine.build("judge-factcheck"), "factcheck", FactCheckFit)?.band ?? DEFAULT_BAND;
    let escalated = 0;
    for (const q of ["a", "b", "c"]) {
      const small = (lite.answers[q] as { noul: number }).noul;
      expect(bd[q]!.scores[SMALL]).toBeCloseTo(small, 6);
      expect(bd[q]!.escalated).toBe(small >= band.lo && small <= band.hi);
      if (bd[q]!.escalated) {
        escalated++;
        expect(Object.keys(bd[q]!.scores).sort()).toEqual([SMALL, LARGE]);
        expect((base.answers[q] as { noul: number }).noul).toBe(bd[q]!.scores[LARGE]);
      } else {
        expect((base.answers[q] as { noul: number }).noul).toBeCloseTo((lite.answers[q] as { noul: number }).noul, 6);
        expect(bd[q]!.raw).toBeCloseTo(ld[q]!.raw, 6);
      }
    }
    expect(base.usage.input_tokens > lite.usage.input_tokens).toBe(escalated > 0);
  });
});
