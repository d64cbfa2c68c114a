import type { PackedTensors } from "./pack.js";
import type { KvLayout, PrefixKv } from "./protocol.js";

/**
 * Several requests' passes as one run of a build's batch graph
 * (`model.batch.onnx`, scripts/batch_graph.py), and the run's output split
 * back per pass.
 *
 * Each pass reads in the batch exactly what it reads alone through
 * `model.onnx`, bit for bit: the W8A8 graph turns float noise of 1e-7 into
 * log-probability shifts of 0.1–0.5 (an activation crossing a rounding step
 * of its row's int8 scale), so the layout keeps every attention row's
 * arithmetic as it is alone. The CPU kernels sum a softmax row in 16-wide
 * lanes and a product's K in blocks of 256 from 0 (measured:
 * docs/experiments/batching.md), so each row holds its own keys at the offsets
 * they have alone, with only keys of probability 0 after them:
 *
 *   own keys      request n's keys [past | prefix], from 0, padded at the end, gathered once per layer
 *                 and read by its prefix rows and all its branch rows (as model.onnx's branches share them);
 *   prefix rows   request n's rows [Sm] against its own keys, causal;
 *   branch rows   request n's branches [Bm, Lm], each row [own past | own prefix | own block | pad],
 *                 gathered from the scores, its values summed as model.onnx sums them (the prefix
 *                 part, then the block part).
 *
 * Tokens are the passes' tokens one pass after another (a token's rows through
 * the linear layers do not depend on the other rows: per-row int8 scales).
 * Keys are a pool: the continued keys of the passes (each past once: most
 * general passes continue the build's preamble), then one per token. Each pass keeps its own readout (its rows of the output, its own
 * width), its own continued keys and values (a prefix-cache hit) and its own
 * kept prefix (a miss that fills the cache).
 *
 * Pure data layout, run on the worker's thread.
 */

/**
 * The layout of the batch graph's inputs this code builds; scripts/batch_graph.py stamps it into the
 * build's manifest (`batch_layout`), and a graph of another layout is not used (the bootstrap rewrites it).
 */
export const BATCH_LAYOUT = 2;

/**
 * The batch graph next to a model file (scripts/batch_graph.py): `model.onnx` → `model.batch.onnx`. Only
 * the graph it was made from has one: a batch must read as that very graph reads each pass alone.
 */
export function batchGraphOf(model: string): string {
  return model.replace(/\.onnx$/, ".batch.onnx");
}

/** One pass of a batch: its tensors as model.onnx takes them and, on a build with keys and values, what it continues and keeps. */
export interface BatchPart extends PackedTensors {
  past?: PrefixKv;
  keep: number;
}

/** The batch graph's inputs (names as in scripts/batch_graph.py). */
export interface JoinedPass {
  inputIds: BigInt64Array;
  positionIds: BigInt64Array;
  gatherIdx: BigInt64Array;
  /** [rows, width], each pass's targets padded with token 0. */
  targetIds: BigInt64Array;
  rows: number;
  width: number;
  /** [2, layers, kvHeads, pastTokens, headDim]: the passes' pasts one after another, each once; empty without any. */
  past: Float32Array;
  pastTokens: number;
  n: number;
  sm: number;
  km: number;
  preRows: BigInt64Array;
  preKeys: BigInt64Array;
  preBias: Float32Array;
  /** Branches per part (padded: a part with fewer has pad branches that read its first key) and slots per branch. */
  bm: number;
  lm: number;
  /** [n, bm, lm] */
  brRows: BigInt64Array;
  /** [n, bm, lm, km + lm] */
  brBias: Float32Array;
  rowCols: BigInt64Array;
  /** [n, bm, lm, lm] */
  blkCols: BigInt64Array;
  /** [n, km] */
  prefKeep: Float32Array;
  rowSrc: BigInt64Array;
  /** Per part: its first token, its first output row, its first continued key. */
  offsets: { token: number; row: number; past: number }[];
}

const prefixOf = (p: PackedTensors) => p.inputIds.length - p.slotOf.length;

/**
 * The batch's inputs. `into` (optional) is scratch memory for the
 * concatenated pasts, used when large enough; `layout` is needed whenever a
 * part continues keys and values.
 */
export function joinPasses(parts: readonly BatchPart[], layout: KvLayout | null, into?: Float32Array): JoinedPass {
  if (parts.length === 0) throw new Error("an empty batch");
  const n = parts.length;
  const T = parts.reduce((s, p) => s + p.inputIds.length, 0);
  // A past several parts continue (the build's preamble, a state asked about twice) is in the pool once.
  const pastAt = new Map<Float32Array, number>();
  let P = 0;
  for (const p of parts) {
    if (!p.past || p.past.tokens === 0 || pastAt.has(p.past.data)) continue;
    pastAt.set(p.past.data, P);
    P += p.past.tokens;
  }
  const S = parts.map(prefixOf);
  const pastOf = parts.map((p) => p.past?.tokens ?? 0);
  const K = parts.map((_, r) => pastOf[r]! + S[r]!);
  const sm = Math.max(...S);
  const km = Math.max(...K);
  const lm = Math.max(...parts.map((p) => p.branchWidth));
  const bm = Math.max(...parts.map((p) => p.branches));
  const width = Math.max(...parts.map((p) => p.width));
  const rows = parts.reduce((s, p) => s + p.rows, 0);
  const NEG = Number.NEGATIVE_INFINITY;

  const inputIds = new BigInt64Array(T);
  const positionIds = new BigInt64Array(T);
  const gatherIdx = new BigInt64Array(rows);
  const targetIds = new BigInt64Array(rows * width);
  const preRows = new BigInt64Array(n * sm);
  const preKeys = new BigInt64Array(n * km);
  const preBias = new Float32Array(n * sm * km).fill(NEG);
  const cols = km + lm;
  const brRows = new BigInt64Array(n * bm * lm);
  const brBias = new Float32Array(n * bm * lm * cols).fill(NEG);
  // A place past the row's own keys and block reads the -inf column the graph appends (index `cols`).
  const rowCols = new BigInt64Array(n * bm * lm * cols).fill(BigInt(cols));
  const blkCols = new BigInt64Array(n * bm * lm * lm);
  const prefKeep = new Float32Array(n * km);
  const rowSrc = new BigInt64Array(T);
  const offsets: JoinedPass["offsets"] = [];

  let tok = 0;
  let row = 0;
  parts.forEach((p, r) => {
    const pOff = p.past ? (pastAt.get(p.past.data) ?? 0) : 0;
    offsets.push({ token: tok, row, past: pOff });
    const s = S[r]!;
    const k = K[r]!;
    inputIds.set(p.inputIds, tok);
    positionIds.set(p.positionIds, tok);
    for (let i = 0; i < p.rows; i++) {
      gatherIdx[row + i] = BigInt(tok + Number(p.gatherIdx[i]));
      for (let c = 0; c < p.width; c++) targetIds[(row + i) * width + c] = p.targetIds[i * p.width + c]!;
    }
    // Its own keys in the pool, in the order they have alone: its past, then its prefix tokens.
    for (let c = 0; c < pastOf[r]!; c++) preKeys[r * km + c] = BigInt(pOff + c);
    for (let i = 0; i < s; i++) preKeys[r * km + pastOf[r]! + i] = BigInt(P + tok + i);
    prefKeep.fill(1, r * km, r * km + k);
    // Prefix rows: causal within its own keys; a pad row sees its first key (finite, discarded).
    for (let i = 0; i < sm; i++) {
      if (i < s) preRows[r * sm + i] = BigInt(tok + i);
      const seen = i < s ? pastOf[r]! + i + 1 : 1;
      preBias.fill(0, (r * sm + i) * km, (r * sm + i) * km + seen);
    }
    for (let i = 0; i < s; i++) rowSrc[tok + i] = BigInt(r * sm + i);
    // Branch rows: model.onnx's block layout, per block, with its own keys before it. A pad branch's rows
    // (a part with fewer branches than bm) read its first key alone (finite, discarded). A block place past
    // a branch's own reads a place of probability 0: the one after its block in a real branch (Lp < lm
    // there), the last place of a pad branch's row (which sees only place 0; cols >= 2).
    const Lp = p.branchWidth;
    brRows.fill(BigInt(tok), r * bm * lm, (r + 1) * bm * lm);
    blkCols.fill(BigInt(k + Lp), r * bm * lm * lm, (r * bm + p.branches) * lm * lm);
    blkCols.fill(BigInt(cols - 1), (r * bm + p.branches) * lm * lm, (r + 1) * bm * lm * lm);
    for (let bl = p.branches; bl < bm; bl++)
      for (let l = 0; l < lm; l++) {
        const at = ((r * bm + bl) * lm + l) * cols;
        brBias[at] = 0;
        rowCols[at] = 0n;
      }
    for (let bl = 0; bl < p.branches; bl++) {
      const g = r * bm + bl;
      const slots = Array.from({ length: Lp }, (_, l) => Number(p.branchSlots[bl * Lp + l]));
      const valid = slots.map((t, l) => Number(p.slotOf[t - s]) === bl * Lp + l);
      for (let l = 0; l < lm; l++) brRows[g * lm + l] = BigInt(tok + (l < Lp ? slots[l]! : slots[0]!));
      for (let l = 0; l < lm; l++) {
        const at = (g * lm + l) * cols;
        brBias.fill(0, at, at + k);
        if (l < Lp) {
          const q = slots[l]!;
          for (let j = 0; j < Lp; j++) {
            const kj = slots[j]!;
            if (valid[j] && kj <= q && q <= Number(p.subtreeEnd[kj])) brBias[at + km + j] = 0;
          }
        }
        for (let c = 0; c < k + Lp; c++) rowCols[at + c] = BigInt(c < k ? c : km + (c - k));
        for (let j = 0; j < Lp; j++) blkCols[(g * lm + l) * lm + j] = BigInt(k + j);
      }
      for (let l = 0; l < Lp; l++) if (valid[l]) rowSrc[tok + slots[l]!] = BigInt(n * sm + g * lm + l);
    }
    tok += p.inputIds.length;
    row += p.rows;
  });

  let past: Float32Array = new Float32Array(0);
  if (P > 0) {
    if (!layout) throw new Error("a batch continuing keys and values needs the build's layout");
    const { headDim } = layout;
    const blocks = 2 * layout.layers * layout.kvHeads;
    const size = blocks * P * headDim;
    past = into && into.length >= size ? into.subarray(0, size) : new Float32Array(size);
    // [2, layers, kvHeads, tokens, headDim]: each (kind, layer, head) block holds every part's tokens in turn.
    for (const p of parts) {
      const pp = p.past;
      if (!pp || pp.tokens === 0 || pastAt.get(pp.data) === undefined) continue;
      const at = pastAt.get(pp.data)!;
      pastAt.delete(pp.data); // copied once
      for (let k = 0; k < blocks; k++) past.set(pp.data.subarray(k * pp.tokens * headDim, (k + 1) * pp.tokens * headDim), (k * P + at) * headDim);
    }
  }
  return { inputIds, positionIds, gatherIdx, targetIds, rows, width, past, pastTokens: P, n, sm, km, preRows, preKeys, preBias, bm, lm, brRows, brBias, rowCols, blkCols, prefKeep, rowSrc, offsets };
}

/** Part `r`'s log-probabilities, [its rows, its width], from the batch's [rows, width] output. */
export function partLogprobs(joined: JoinedPass, parts: readonly BatchPart[], r: number, logprobs: Float32Array): Float32Array {
  const p = parts[r]!;
  const first = joined.offsets[r]!.row;
  const out = new Float32Array(p.rows * p.width);
  for (let k = 0; k < p.rows; k++) out.set(logprobs.subarray((first + k) * joined.width, (first + k) * joined.width + p.width), k * p.width);
  return out;
}

/**
 * The keys and values part `r` keeps (its first `keep` own keys: what it
 * continued, then its prefix tokens'), from the batch's present_kv, the pool
 * [2, layers, kvHeads, pastTokens + tokens, headDim], into `out`.
 */
export function partPresent(joined: JoinedPass, parts: readonly BatchPart[], r: number, present: Float32Array, layout: KvLayout, out: Float32Array): PrefixKv {
  const p = parts[r]!;
  const { headDim } = layout;
  const blocks = 2 * layout.layers * layout.kvHeads;
  const total = present.length / (blocks * headDim);
  const pt = p.past?.tokens ?? 0;
  const keep = Math.min(p.keep, pt + prefixOf(p));
  const fromPast = Math.min(keep, pt);
  const fromNew = keep - fromPast;
  const { past: pastAt, token } = joined.offsets[r]!;
  const newAt = joined.pastTokens + token;
  for (let k = 0; k < blocks; k++) {
    const src = k * total;
    const dst = k * keep * headDim;
    out.set(present.subarray((src + pastAt) * headDim, (src + pastAt + fromPast) * headDim), dst);
    out.set(present.subarray((src + newAt) * headDim, (src + newAt + fromNew) * headDim), dst + fromPast * headDim);
  }
  return { data: out, tokens: keep };
}
