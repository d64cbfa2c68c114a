import MiniSearch from "minisearch";
import { eng } from "stopword";

/**
 * The evidence cut (`ASSAY_FACTCHECK_EVIDENCE_TOKENS`, 1,024 by default): a
 * document longer than one window is read, for each claim, from one passage
 * of it: the run of consecutive lines, up to the budget, whose lines are most
 * like the claim (summed BM25). A passage reads as the document does, with
 * what surrounds the matching lines; a collage of the best-matching lines from
 * anywhere lost to it on both long-document forms measured, and it read
 * claims at least as well as every window did (a little better on both, within
 * noise) for a fifth of the tokens (docs/experiments/fact-check.md). Each claim's cut depends on the document and that claim alone, never on
 * the other claims of a request.
 */

/** A piece of the document kept or dropped whole: a line, or a run of sentences of a long line. */
export interface Segment {
  text: string;
  /** Character offsets into the document: `document.slice(start, end) === text`. */
  start: number;
  end: number;
}

/**
 * Longer lines are cut at sentence ends, so a passage can begin or end inside
 * a web page's paragraph of 3,000 characters rather than take it all or none.
 */
export const MAX_SEGMENT_CHARS = 500;

const sentences = new Intl.Segmenter("en", { granularity: "sentence" });
const STOP = new Set(eng);

/** Offsets [a, b) within `line` of pieces of at most `max` characters: whole sentences where they fit, else words. */
function pieces(line: string, max: number): [number, number][] {
  const out: [number, number][] = [];
  for (const { index, segment } of sentences.segment(line)) {
    let a = index;
    const end = index + segment.length;
    while (end - a > max) {
      // A sentence longer than the cap ends at its last space before it (or at the cap, with none).
      const space = line.lastIndexOf(" ", a + max);
      const b = space > a ? space + 1 : a + max;
      out.push([a, b]);
      a = b;
    }
    if (end > a) out.push([a, end]);
  }
  // Consecutive sentences share a segment up to the cap, so a segment is a passage, not a fragment.
  const merged: [number, number][] = [];
  for (const p of out) {
    const last = merged.at(-1);
    if (last && p[1] - last[0] <= max) last[1] = p[1];
    else merged.push([...p]);
  }
  return merged;
}

export function segmentDocument(document: string, max = MAX_SEGMENT_CHARS): Segment[] {
  const out: Segment[] = [];
  for (const m of document.matchAll(/[^\n]+/g)) {
    const line = m[0];
    const start = m.index;
    if (line.trim().length === 0) continue;
    for (const [a, b] of line.length <= max ? [[0, line.length] as [number, number]] : pieces(line, max)) {
      const text = line.slice(a, b);
      if (text.trim().length > 0) out.push({ text, start: start + a, end: start + b });
    }
  }
  return out;
}

/** One document's segments and their BM25 index, built once and shared by every claim of a request. */
export class EvidenceIndex {
  readonly segments: Segment[];
  private readonly search: MiniSearch<{ id: number; text: string }>;
  /** Each segment's size in tokens, measured once, when a claim's sweep first reaches it. */
  private readonly sizes: (number | undefined)[];

  /** `tokens` measures a segment in the reading build's tokens, its line break included. */
  constructor(
    private readonly document: string,
    private readonly tokens: (text: string) => number,
  ) {
    this.segments = segmentDocument(document);
    this.sizes = this.segments.map(() => undefined);
    this.search = new MiniSearch({
      fields: ["text"],
      // Stop words dropped: "the" and "was" would otherwise pull in every line of a web page.
      processTerm: (term) => {
        const t = term.toLowerCase();
        return STOP.has(t) ? null : t;
      },
    });
    this.search.addAll(this.segments.map((s, id) => ({ id, text: s.text })));
  }

  /**
   * The passage for `claim`: the consecutive segments that fit in `budget`
   * tokens with the highest summed score, as one slice of the document (its
   * blank lines kept). Ties go to the earlier passage, so a claim that shares
   * no word with the document reads its top, as a reader would start there.
   * Null when no segment alone fits the budget.
   */
  passage(claim: string, budget: number): Segment | null {
    const score = this.segments.map(() => 0);
    for (const h of this.search.search(claim, { combineWith: "OR" })) score[h.id as number] = h.score;
    const size = (i: number) => (this.sizes[i] ??= this.tokens(this.segments[i]!.text));
    // Scores are never negative, so the best passage starting at i is the longest that fits: one sweep.
    let best: [number, number] | null = null;
    let bestScore = -1;
    let end = 0;
    let used = 0;
    let sum = 0;
    for (let start = 0; start < this.segments.length; start++) {
      if (end < start) [end, used, sum] = [start, 0, 0];
      while (end < this.segments.length && used + size(end) <= budget) {
        used += size(end);
        sum += score[end]!;
        end++;
      }
      if (end > start) {
        if (sum > bestScore) [best, bestScore] = [[start, end], sum];
        used -= size(start);
        sum -= score[start]!;
      }
    }
    if (!best) return null;
    const from = this.segments[best[0]]!.start;
    const to = this.segments[best[1] - 1]!.end;
    return { text: this.document.slice(from, to), start: from, end: to };
  }
}
