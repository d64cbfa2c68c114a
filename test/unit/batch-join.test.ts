/**
 * The layout of several requests' passes as one (src/inference/batch.ts),
 * checked against the attention each pass has alone in model.onnx
 * (scripts/export_onnx.py) and the attention the batch graph computes from
 * the layout (scripts/batch_graph.py), both written out here as references:
 * every token's softmax row holds, place for place, the keys it holds alone,
 * then only places of probability 0 (what keeps the W8A8 graph's sums bit for
 * bit: docs/experiments/batching.md); its readout rows hold its own targets;
 * what it continues and what it keeps are its own.
 */
import { describe, expect, it } from "vitest";
import { joinPasses, partLogprobs, partPresent, type BatchPart, type JoinedPass } from "../../src/inference/batch.js";
import { attentionPairs, batchShape, shapeOf } from "../../src/inference/cost.js";
import { pack, type EncodedQuestion } from "../../src/inference/pack.js";

const q = (suffix: number[], labels: number[][], group?: number): EncodedQuestion => ({ suffix, labels, terminator: 2, ...(group !== undefined ? { group } : {}) });

/** An attention row as places: each place a key (a continued key `p…` or a token `t…`, of a part) or "-" (probability 0). */
type Row = string[];

/**
 * A part's attention rows alone, as model.onnx computes them
 * (scripts/export_onnx.py): a prefix token's row is [past | prefix] with the
 * later prefix masked; a branch token's row is [past | prefix] then its
 * block's slots, a slot seen when it is a real slot and an ancestor-or-self
 * (`j <= i <= subtree_end[j]`).
 */
function aloneRows(p: BatchPart, part: number): Map<number, Row> {
  const T = p.inputIds.length;
  const R = p.slotOf.length;
  const S = T - R;
  const P = p.past?.tokens ?? 0;
  const L = p.branchWidth;
  const own = [...Array.from({ length: P }, (_, c) => `${part}:p${c}`), ...Array.from({ length: S }, (_, i) => `${part}:t${i}`)];
  const out = new Map<number, Row>();
  for (let i = 0; i < S; i++) out.set(i, own.map((k, c) => (c <= P + i ? k : "-")));
  for (let b = 0; b < p.branches; b++) {
    const slots = Array.from({ length: L }, (_, l) => Number(p.branchSlots[b * L + l]));
    const real = slots.map((g, l) => Number(p.slotOf[g - S]) === b * L + l);
    slots.forEach((g, l) => {
      if (!real[l]) return;
      out.set(g, [...own, ...slots.map((gj, j) => (real[j] && gj <= g && g <= Number(p.subtreeEnd[gj]) ? `${part}:t${gj}` : "-"))]);
    });
  }
  return out;
}

/** Every token's attention row in the batch graph, read off its inputs as scripts/batch_graph.py reads them. */
function batchRows(j: JoinedPass, ps: readonly BatchPart[]): Map<number, Row> {
  const partAt = (at: (o: JoinedPass["offsets"][number]) => number, x: number) => {
    let r = 0;
    j.offsets.forEach((o, i) => {
      if (at(o) <= x && (at === pastAt ? (ps[i]!.past?.tokens ?? 0) > 0 : true)) r = i;
    });
    return r;
  };
  const pastAt = (o: JoinedPass["offsets"][number]) => o.past;
  const keyName = (pool: number): string => {
    if (pool < j.pastTokens) {
      const r = partAt(pastAt, pool);
      return `${r}:p${pool - j.offsets[r]!.past}`;
    }
    const t = pool - j.pastTokens;
    const r = partAt((o) => o.token, t);
    return `${r}:t${t - j.offsets[r]!.token}`;
  };
  const byRow = new Map<number, Row>();
  for (let n = 0; n < j.n; n++)
    for (let i = 0; i < j.sm; i++)
      byRow.set(n * j.sm + i, Array.from({ length: j.km }, (_, c) => (j.preBias[(n * j.sm + i) * j.km + c] === 0 ? keyName(Number(j.preKeys[n * j.km + c])) : "-")));
  // A branch row's own-key places read its request's keys (pre_keys), its block places its block's tokens.
  const cols = j.km + j.lm;
  for (let g = 0; g < j.n * j.bm; g++) {
    const n = Math.floor(g / j.bm);
    for (let l = 0; l < j.lm; l++) {
      const at = (g * j.lm + l) * cols;
      byRow.set(
        j.n * j.sm + g * j.lm + l,
        Array.from({ length: cols }, (_, c) => {
          const col = Number(j.rowCols[at + c]);
          if (col === cols || j.brBias[at + col] !== 0) return "-";
          return col < j.km ? keyName(Number(j.preKeys[n * j.km + col])) : keyName(j.pastTokens + Number(j.brRows[g * j.lm + col - j.km]));
        }),
      );
    }
  }
  const out = new Map<number, Row>();
  for (let t = 0; t < j.inputIds.length; t++) out.set(t, byRow.get(Number(j.rowSrc[t]))!);
  return out;
}

function parts(): BatchPart[] {
  const a = pack([5, 6, 7, 8], [q([9, 10], [[11], [12]]), q([13], [[14, 15], [14, 16]])]);
  const b = pack([20, 21], [q([22, 23, 24], [[25], [26], [27]])]);
  // Two presentations of one question (a stem shared in one block), labels that nest (a terminator row).
  const c = pack([30, 31, 32, 33, 34, 35], [q([36, 37, 38], [[40], [40, 41]], 0), q([36, 37, 39], [[40], [40, 41]], 0)]);
  const layout = { layers: 2, kvHeads: 1, headDim: 2 };
  const past = (tokens: number, fill: number) => ({ data: Float32Array.from({ length: 2 * layout.layers * layout.kvHeads * tokens * layout.headDim }, (_, i) => fill + i), tokens });
  return [
    { ...a, past: past(3, 100), keep: 0 },
    { ...b, keep: 2 },
    { ...c, past: past(2, 500), keep: 5 },
  ];
}
const LAYOUT = { layers: 2, kvHeads: 1, headDim: 2 };

describe("joinPasses", () => {
  it("gives every token the attention row it has alone, place for place, with only places of probability 0 after it", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    const rows = batchRows(j, ps);
    ps.forEach((p, r) => {
      const o = j.offsets[r]!;
      for (const [i, alone] of aloneRows(p, r)) {
        expect(j.inputIds[o.token + i]).toBe(p.inputIds[i]);
        expect(j.positionIds[o.token + i]).toBe(p.positionIds[i]);
        const got = rows.get(o.token + i)!;
        expect(got.slice(0, alone.length)).toEqual(alone);
        expect(got.slice(alone.length).every((k) => k === "-")).toBe(true);
      }
    });
  });

  it("sums a branch row's values as model.onnx does: its own keys' part from place 0, its block's part from the block's first place", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    ps.forEach((p, r) => {
      const k = (p.past?.tokens ?? 0) + p.inputIds.length - p.slotOf.length;
      expect(Array.from(j.prefKeep.subarray(r * j.km, (r + 1) * j.km))).toEqual(Array.from({ length: j.km }, (_, c) => (c < k ? 1 : 0)));
      for (let b = 0; b < p.branches; b++) {
        const g = r * j.bm + b;
        for (let l = 0; l < j.lm; l++)
          for (let jj = 0; jj < j.lm; jj++) expect(Number(j.blkCols[(g * j.lm + l) * j.lm + jj])).toBe(jj < p.branchWidth ? k + jj : k + p.branchWidth);
      }
    });
  });

  it("pads a part with fewer branches than the most with branches that read only its first key", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    const cols = j.km + j.lm;
    ps.forEach((p, r) => {
      for (let b = p.branches; b < j.bm; b++)
        for (let l = 0; l < j.lm; l++) {
          const at = ((r * j.bm + b) * j.lm + l) * cols;
          const seen = Array.from({ length: cols }, (_, c) => Number(j.rowCols[at + c])).filter((col) => col < cols && j.brBias[at + col] === 0);
          expect(seen).toEqual([0]);
          expect(j.brRows[(r * j.bm + b) * j.lm + l]).toBe(BigInt(j.offsets[r]!.token));
        }
    });
    // and no token reads its answer from a pad branch
    const padRows = new Set<number>();
    ps.forEach((p, r) => {
      for (let b = p.branches; b < j.bm; b++) for (let l = 0; l < j.lm; l++) padRows.add(j.n * j.sm + (r * j.bm + b) * j.lm + l);
    });
    expect(Array.from(j.rowSrc).some((x) => padRows.has(Number(x)))).toBe(false);
    expect(j.bm).toBe(Math.max(...ps.map((p) => p.branches)));
    expect(ps.some((p) => p.branches < j.bm)).toBe(true);
  });

  it("reads each part's rows at its own tokens, with its own targets, and hands each its own [rows, width] back", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    expect(j.width).toBe(Math.max(...ps.map((p) => p.width)));
    const out = Float32Array.from({ length: j.rows * j.width }, (_, i) => i);
    ps.forEach((p, r) => {
      const o = j.offsets[r]!;
      for (let k = 0; k < p.rows; k++) {
        expect(Number(j.gatherIdx[o.row + k])).toBe(o.token + Number(p.gatherIdx[k]));
        for (let c = 0; c < p.width; c++) expect(j.targetIds[(o.row + k) * j.width + c]).toBe(p.targetIds[k * p.width + c]);
      }
      const mine = partLogprobs(j, ps, r, out);
      expect(mine.length).toBe(p.rows * p.width);
      for (let k = 0; k < p.rows; k++) for (let c = 0; c < p.width; c++) expect(mine[k * p.width + c]).toBe((o.row + k) * j.width + c);
    });
  });

  it("concatenates the pasts per layer and head, and gives each part the keys and values it keeps", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    const blocks = 2 * LAYOUT.layers * LAYOUT.kvHeads;
    const D = LAYOUT.headDim;
    expect(j.pastTokens).toBe(5);
    for (let k = 0; k < blocks; k++) {
      ps.forEach((p, r) => {
        const pt = p.past?.tokens ?? 0;
        for (let t = 0; t < pt * D; t++) expect(j.past[(k * j.pastTokens + j.offsets[r]!.past) * D + t]).toBe(p.past!.data[k * pt * D + t]);
      });
    }
    // A present pool where each entry tells its (block, key, d): the part's slices come out in order.
    const total = j.pastTokens + j.inputIds.length;
    const present = Float32Array.from({ length: blocks * total * D }, (_, i) => i);
    const kept = partPresent(j, ps, 2, present, LAYOUT, new Float32Array(blocks * 5 * D));
    expect(kept.tokens).toBe(5);
    for (let k = 0; k < blocks; k++) {
      // Its 2 continued keys, then its first 3 prefix tokens.
      const want = [0, 1].map((t) => k * total + j.offsets[2]!.past + t).concat([0, 1, 2].map((t) => k * total + j.pastTokens + j.offsets[2]!.token + t));
      for (let t = 0; t < 5; t++) for (let d = 0; d < D; d++) expect(kept.data[(k * 5 + t) * D + d]).toBe(want[t]! * D + d);
    }
  });

  it("holds a past that several parts continue once, and each part still sees it as its own", () => {
    const ps = parts();
    const shared = { ...pack([50, 51, 52], [q([53], [[54], [55]])]), past: ps[0]!.past!, keep: 4 };
    const all = [...ps, shared];
    const j = joinPasses(all, LAYOUT);
    expect(j.pastTokens).toBe(5);
    expect(j.offsets[3]!.past).toBe(j.offsets[0]!.past);
    const rows = batchRows(j, all);
    for (const [i, alone] of aloneRows(shared, 0)) {
      // Its continued keys are the shared past's (one set of keys for parts 0 and 3), its own tokens its own.
      const got = rows.get(j.offsets[3]!.token + i)!;
      const shared = (k: string) => k.replace(/^\d+:p/, "shared:p");
      expect(got.slice(0, alone.length).map(shared)).toEqual(alone.map((k) => shared(k.replace("0:t", "3:t"))));
    }
    const total = j.pastTokens + j.inputIds.length;
    const blocks = 2 * LAYOUT.layers * LAYOUT.kvHeads;
    const present = Float32Array.from({ length: blocks * total * LAYOUT.headDim }, (_, i) => i);
    const kept = partPresent(j, all, 3, present, LAYOUT, new Float32Array(blocks * 4 * LAYOUT.headDim));
    expect(kept.data[LAYOUT.headDim * 3]).toBe((j.pastTokens + j.offsets[3]!.token) * LAYOUT.headDim);
  });

  it("reads every place in range when the part with the fewest branches has the most keys and the widest block", () => {
    // The first part: the longest state, one question with a long label (the widest block); the second: three short ones.
    const wide = { ...pack([1, 2, 3, 4, 5, 6, 7, 8], [q([9], [[10, 11, 12, 13]])]), keep: 0 };
    const many = { ...pack([20], [q([21], [[22]]), q([23], [[24]]), q([25], [[26]])]), keep: 0 };
    const j = joinPasses([wide, many], LAYOUT);
    const cols = j.km + j.lm;
    expect(wide.branchWidth).toBe(j.lm);
    expect(wide.branches).toBeLessThan(j.bm);
    // GatherElements refuses an index past the row: the score row has cols + 1 places (the -inf one), p has cols.
    expect(Math.max(...Array.from(j.rowCols, Number))).toBeLessThanOrEqual(cols);
    expect(Math.max(...Array.from(j.blkCols, Number))).toBeLessThan(cols);
    // and every place a block column reads beyond its branch's own block has probability 0 (a -inf place or a pad row's)
    const rows = batchRows(j, [wide, many]);
    for (const [i, alone] of aloneRows(wide, 0)) expect(rows.get(i)!.slice(0, alone.length)).toEqual(alone);
  });

  it("charges the cost model the pairs the batch graph computes", () => {
    const ps = parts();
    const j = joinPasses(ps, LAYOUT);
    const shape = batchShape(ps.map((p) => shapeOf(p, p.past?.tokens ?? 0)));
    expect(shape.tokens).toBe(j.inputIds.length);
    expect(attentionPairs(shape)).toBe(j.n * (j.sm * j.km + j.bm * j.lm * (j.km + j.lm)));
  });
});
