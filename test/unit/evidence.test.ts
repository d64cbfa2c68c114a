/**
 * The evidence cut (src/prompt/evidence.ts): how a long fact check document
 * is split into segments and which of them a claim is read against. Token
 * counts here are characters / 4 (a stand-in measure passed in, as the
 * family passes the build's tokenizer); the engine test reads a real cut.
 */
import { describe, expect, it } from "vitest";
import { EvidenceIndex, MAX_SEGMENT_CHARS, evidenceText, segmentDocument } from "../../src/prompt/evidence.js";

const quarter = (text: string) => Math.ceil(text.length / 4) + 1;

const filler = Array.from({ length: 40 }, (_, i) => `Paragraph ${i}: the committee discussed routine budget items and adjourned.`);
const doc = [
  "TITLE: Minutes of the town council",
  ...filler.slice(0, 20),
  "The museum will open a new wing for Roman coins in 2027, the mayor announced.",
  ...filler.slice(20),
  "The bridge on Harbor Street reopened in May after repairs.",
].join("\n");

describe("segmentDocument", () => {
  it("keeps each short line whole, with offsets back into the document, and skips blank lines", () => {
    const segs = segmentDocument("first line\n\n   \nsecond line\n");
    expect(segs.map((s) => s.text)).toEqual(["first line", "second line"]);
    for (const s of segs) expect("first line\n\n   \nsecond line\n".slice(s.start, s.end)).toBe(s.text);
  });

  it("cuts a long line at sentence ends, and a sentence longer than the cap at a space", () => {
    const sentence = (i: number) => `Sentence number ${i} says something about the harbour and the town.`;
    const paragraph = Array.from({ length: 30 }, (_, i) => sentence(i)).join(" ");
    const run = "word ".repeat(300).trim();
    const text = `${paragraph}\n${run}`;
    const segs = segmentDocument(text);
    for (const s of segs) {
      expect(s.text.length).toBeLessThanOrEqual(MAX_SEGMENT_CHARS);
      expect(text.slice(s.start, s.end)).toBe(s.text);
    }
    // The paragraph's segments end at sentence ends: none starts mid-sentence.
    for (const s of segs.filter((x) => x.start < paragraph.length)) expect(s.text.trimStart()).toMatch(/^Sentence number \d+/);
    // Together the segments cover every character of both lines but the line break.
    expect(segs.reduce((n, s) => n + s.text.length, 0)).toBe(text.length - 1);
    expect(segs.length).toBeGreaterThan(5);
  });
});

describe("EvidenceIndex.select", () => {
  const index = new EvidenceIndex(doc, quarter);

  it("keeps the line most like the claim, within the budget, in document order", () => {
    const segs = index.select("The museum opens a wing for Roman coins.", 60);
    expect(segs[0]!.text).toContain("Roman coins");
    expect(segs.reduce((n, s) => n + quarter(s.text), 0)).toBeLessThanOrEqual(60);
    const starts = segs.map((s) => s.start);
    expect(starts).toEqual([...starts].sort((a, b) => a - b));
  });

  it("fills the budget with the next-best lines, and a larger budget keeps what a smaller one kept", () => {
    const claim = "The committee said the museum opens a wing for Roman coins.";
    const small = index.select(claim, 60);
    const large = index.select(claim, 400);
    expect(small.some((s) => s.text.includes("Roman coins"))).toBe(true);
    expect(large.filter((s) => s.text.includes("committee")).length).toBeGreaterThan(small.filter((s) => s.text.includes("committee")).length);
    expect(large.reduce((n, s) => n + quarter(s.text), 0)).toBeGreaterThan(300);
    for (const s of small) expect(large).toContainEqual(s);
  });

  it("reads only lines that share a word with the claim: the budget is a ceiling, not a fill", () => {
    const segs = index.select("The museum opens a wing for Roman coins on Harbor Street.", 400);
    expect(segs.map((s) => s.text)).toEqual([
      "The museum will open a new wing for Roman coins in 2027, the mayor announced.",
      "The bridge on Harbor Street reopened in May after repairs.",
    ]);
  });

  it("ignores stop words: a claim of stop words alone reads the document from the top", () => {
    const segs = index.select("It was the one that they had.", 40);
    expect(segs[0]!.text).toBe("TITLE: Minutes of the town council");
    expect(segs.map((s) => s.start)).toEqual(segmentDocument(doc).slice(0, segs.length).map((s) => s.start));
  });

  it("is the same cut on every call, whatever else was asked of the index", () => {
    const claim = "The committee discussed budget items.";
    const first = evidenceText(index.select(claim, 200));
    index.select("Something about coins and bridges.", 200);
    expect(evidenceText(new EvidenceIndex(doc, quarter).select(claim, 200))).toBe(first);
    expect(evidenceText(index.select(claim, 200))).toBe(first);
  });

  it("passes over a segment that alone exceeds the budget and returns nothing when none fits", () => {
    expect(index.select("Roman coins", 3)).toEqual([]);
  });
});
