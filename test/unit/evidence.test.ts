/**
 * The evidence cut (src/prompt/evidence.ts): how a long fact check document
 * is split into segments and which passage of them a claim is read against. Token
 * counts here are characters / 4 (a stand-in measure passed in, as the
 * family passes the build's tokenizer); the engine test reads a real cut.
 */
import { describe, expect, it } from "vitest";
import { EvidenceIndex, MAX_SEGMENT_CHARS, segmentDocument, type Segment } from "../../src/prompt/evidence.js";

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

describe("EvidenceIndex.passage", () => {
  const index = new EvidenceIndex(doc, quarter);
  const segments = segmentDocument(doc);
  /** The segments a passage spans, and their size in the stand-in measure. */
  const spanned = (p: Segment) => segments.filter((s) => s.start >= p.start && s.end <= p.end);
  const size = (p: Segment) => spanned(p).reduce((n, s) => n + quarter(s.text), 0);

  it("is one slice of the document that holds the line most like the claim, within the budget", () => {
    const p = index.passage("The museum opens a wing for Roman coins.", 60)!;
    expect(p.text).toContain("Roman coins");
    expect(doc.slice(p.start, p.end)).toBe(p.text);
    expect(size(p)).toBeLessThanOrEqual(60);
    // The lines around the best one come with it, in the document's order, line breaks kept.
    expect(spanned(p).length).toBeGreaterThan(1);
    expect(p.text).toContain("\n");
  });

  it("is the longest run of lines that fits: the next line would pass the budget", () => {
    for (const budget of [60, 200, 400]) {
      const p = index.passage("The committee discussed budget items.", budget)!;
      const next = segments.find((s) => s.start >= p.end);
      expect(size(p)).toBeLessThanOrEqual(budget);
      if (next) expect(size(p) + quarter(next.text)).toBeGreaterThan(budget);
    }
  });

  it("keeps the run around the best-matching line rather than matching lines from elsewhere", () => {
    // The museum line (four of the claim's words) and the bridge line (two) are twenty lines apart: a
    // passage of 400 cannot hold both, and a collage of the two is not a passage.
    const p = index.passage("The museum opens a wing for Roman coins on Harbor Street.", 400)!;
    expect(p.text).toContain("Roman coins");
    expect(p.text).not.toContain("Harbor Street");
    expect(spanned(p).length).toBeGreaterThan(10);
  });

  it("goes to the earlier passage on a tie: a claim of stop words alone reads the document from the top", () => {
    const p = index.passage("It was the one that they had.", 40)!;
    expect(p.start).toBe(0);
    expect(p.text.startsWith("TITLE: Minutes of the town council")).toBe(true);
  });

  it("is the same cut on every call, whatever else was asked of the index", () => {
    const claim = "The committee discussed budget items.";
    const first = index.passage(claim, 200);
    index.passage("Something about coins and bridges.", 200);
    expect(new EvidenceIndex(doc, quarter).passage(claim, 200)).toEqual(first);
    expect(index.passage(claim, 200)).toEqual(first);
  });

  it("is null when no segment alone fits the budget", () => {
    expect(index.passage("Roman coins", 3)).toBeNull();
  });
});
