import MiniSearch from "minisearch";
import { eng } from "stopword";

/**
 * The evidence cut (`ASSAY_FACTCHECK_EVIDENCE_TOKENS` above 0): a document
 * longer than one window, cut for one claim to the lines most like the claim
 * (BM25), kept in document order. On WiCE's long test documents the large
 * build reads a claim as well from this cut as from every window of the
 * document, for a sixth of the tokens; on a document made of several
 * unrelated ones it is misled by the other documents' lines that share the
 * claim's words (bench/RESULTS.md, session 30), so it is not the default.
 * Each claim's cut depends on the document and that claim alone, never on
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
 * Longer lines are cut at sentence ends: a web page's paragraph of 3,000
 * characters would otherwise be all or nothing of a 4,000-character cut.
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
  /** Each segment's size in tokens, measured once, when a claim first ranks it. */
  private readonly sizes: (number | undefined)[];

  /** `tokens` measures a segment in the reading build's tokens, its line break included. */
  constructor(
    document: string,
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
   * The segments for `claim`, in document order: the best-scoring ones that
   * fit in `budget` tokens. A claim that shares no word with the document
   * gets the document's first segments, as a reader would start at the top.
   */
  select(claim: string, budget: number): Segment[] {
    const hits = this.search.search(claim, { combineWith: "OR" });
    // Ties are broken by position so the cut is the same on every run.
    const ranked = hits.length > 0 ? hits.sort((x, y) => y.score - x.score || x.id - y.id).map((h) => h.id as number) : this.segments.map((_, i) => i);
    const kept: number[] = [];
    let used = 0;
    for (const i of ranked) {
      if (used >= budget) break;
      const n = (this.sizes[i] ??= this.tokens(this.segments[i]!.text));
      // A segment that does not fit is passed over; a shorter one further down may still fit.
      if (used + n > budget) continue;
      kept.push(i);
      used += n;
    }
    return kept.sort((a, b) => a - b).map((i) => this.segments[i]!);
  }
}

/** The text a claim is read against: its segments, one per line. */
export function evidenceText(segments: readonly Segment[]): string {
  return segments.map((s) => s.text).join("\n");
}
