import type { ExecutionProvider } from "../config/index.js";
import type { PackedTensors } from "./pack.js";

/**
 * What one packed forward pass costs, per build: a live estimate that the
 * admission check (src/inference/work.ts) reads before it accepts a request.
 *
 *   ms ≈ perPass + perToken · tokens + perPair · attention pairs
 *
 * `tokens` is the packed length (every linear layer runs on each token once).
 * Attention is split (src/inference/pack.ts): the prefix attends causally to
 * itself and each of the `branches` question blocks, padded to `width`,
 * attends to the prefix and to its own tokens, so the pairs are
 * P(P+1)/2 + B·W·(P + (W+1)/2). A pass that continues `past` keys and values
 * (a cached state, the pinned preamble, a long state's earlier chunks) has
 * every row attend to them too: V·(P + B·W) more. On a CPU the pair term is a
 * third of a 2,000-token pass and most of an 8,000-token one; on short passes
 * it is noise.
 *
 * The three coefficients are a least-squares fit on relative error over the
 * passes the build has run, older passes weighing less and less (a factor
 * FORGET per pass), so the estimate follows the machine when its load
 * changes. Before the first pass the fit stands on four pseudo-passes drawn
 * from a prior (the build's size, the provider and the threads); they fade
 * like real passes but never quite to zero, and they follow the speed the
 * real passes show (the prior's proportions at the measured pace), which
 * keeps a direction the real passes never varied (every pass the same
 * length) in the prior's proportion.
 */

export interface PassShape {
  /** Packed tokens (prefix + every block). */
  tokens: number;
  /** Tokens of the shared prefix. */
  prefix: number;
  /** Question blocks (branches) after the prefix. */
  branches: number;
  /** Longest block: every block is padded to it in the attention. */
  width: number;
  /** Keys and values the pass continues (computed by an earlier pass); absent: none. */
  past?: number;
  /** The query–key pairs, where the graph's layout is not model.onnx's (a batched run: batchShape). */
  pairs?: number;
}

export interface CostCoefficients {
  perPass: number;
  perToken: number;
  perPair: number;
}

/** `s` continuing `past` keys and values (none: the field absent, as on a pass that continues nothing). */
export function withPast(s: PassShape, past: number): PassShape {
  const { past: _previous, ...rest } = s;
  return past > 0 ? { ...rest, past } : rest;
}

/** The shape of a packed request as the worker will run it, continuing `past` keys and values. */
export function shapeOf(p: PackedTensors, past = 0): PassShape {
  const tokens = p.inputIds.length;
  return withPast({ tokens, prefix: tokens - p.slotOf.length, branches: p.branches, width: p.branchWidth }, past);
}

/**
 * The shape of passes run as one by the batch graph (src/inference/batch.ts):
 * their tokens, and the query–key pairs that graph computes, which its
 * layout sets: each request's prefix rows against its own keys, padded to the
 * longest ([N, Sm, Km]), and each request's branches (padded to the most
 * any request has) against its keys and their own blocks ([N, Bm, Lm, Km + Lm]).
 */
export function batchShape(parts: readonly PassShape[]): PassShape {
  const sm = Math.max(...parts.map((s) => s.prefix));
  const km = Math.max(...parts.map((s) => s.prefix + (s.past ?? 0)));
  const lm = Math.max(...parts.map((s) => s.width));
  const b = parts.reduce((n, s) => n + s.branches, 0);
  const bm = Math.max(...parts.map((s) => s.branches));
  return {
    ...withPast(
      { tokens: parts.reduce((n, s) => n + s.tokens, 0), prefix: parts.reduce((n, s) => n + s.prefix, 0), branches: b, width: lm },
      parts.reduce((n, s) => n + (s.past ?? 0), 0),
    ),
    pairs: parts.length * (sm * km + bm * lm * (km + lm)),
  };
}

/** The most score floats one layer's attention of a batched run holds per head: the prefix rows' or the branch rows'. */
export function batchScores(parts: readonly PassShape[]): number {
  const sm = Math.max(...parts.map((s) => s.prefix));
  const km = Math.max(...parts.map((s) => s.prefix + (s.past ?? 0)));
  const lm = Math.max(...parts.map((s) => s.width));
  const bm = Math.max(...parts.map((s) => s.branches));
  return parts.length * Math.max(sm * km, bm * lm * (km + lm + 1));
}

/** Query–key pairs the split attention computes for a pass (per head and layer). */
export function attentionPairs(s: PassShape): number {
  if (s.pairs !== undefined) return s.pairs;
  const past = s.past ?? 0;
  return past * (s.prefix + s.branches * s.width) + (s.prefix * (s.prefix + 1)) / 2 + s.branches * s.width * (s.prefix + (s.width + 1) / 2);
}

export interface BuildFacts {
  /** Weights (parameters) of the model. */
  parameters: number;
  hiddenSize: number;
  layers: number;
}

/**
 * Reference: Qwen2.5-Coder-0.5B W8A8 (630M parameters, 896 × 24) on 2 cores of
 * the project's machine (docs/experiments/latency-and-throughput.md: 164, 612 and 2,148-token
 * passes in 325, 1,467 and 8,179 ms) fits 1.83 ms per token and 1.84 µs per
 * attention pair. Other builds scale by parameters (linear layers, and the
 * part of a pass apart from its tokens: the weights read once more) and by
 * hidden size × layers (attention); other thread counts by 1.78× per
 * doubling, as measured from 1 to 2 threads.
 */
const REF = { parameters: 630_167_424, attention: 896 * 24, threads: 2, perToken: 1.83, perPair: 1.84e-3, perPass: 10 };
/** A GPU runs a pass this many times faster than 2 CPU cores, before its first pass says otherwise (deliberately cautious). */
const GPU_SPEEDUP = 20;

export function priorCoefficients(facts: BuildFacts | null, provider: ExecutionProvider, threads: number): CostCoefficients {
  const f = facts ?? { parameters: REF.parameters, hiddenSize: 896, layers: 24 };
  const threadScale = Math.pow(REF.threads / Math.max(1, threads), Math.log2(1.78));
  const device = provider === "cpu" ? threadScale : 1 / GPU_SPEEDUP;
  return {
    // The part of a pass apart from its tokens is mostly the weights read once more: it grows with them.
    perPass: REF.perPass * (f.parameters / REF.parameters),
    perToken: REF.perToken * (f.parameters / REF.parameters) * device,
    perPair: REF.perPair * ((f.hiddenSize * f.layers) / REF.attention) * device,
  };
}

/** Per-pass weight decay: the last ~10 passes make most of the estimate. */
const FORGET = 0.9;
/** What the prior's pseudo-passes weigh at the start, and the floor they decay to (in passes). */
const PRIOR_WEIGHT = 3;
const PRIOR_FLOOR = 0.02;
/** The pace starts at the prior's, as if it had run this many milliseconds of passes at it. */
const SPEED_PRIOR_MS = 1_000;
/**
 * On a GPU the prior is a guess at a device never measured (an H200 or llvmpipe, a software Vulkan device
 * 200 times slower than the CPU): the first passes, the boot's warm-up among them, set the pace. With the
 * CPU's weight, WebGPU on llvmpipe estimated the README's request at 16.5 s after boot, ran it in about
 * 100 s, and answered 504 at its 60 s deadline.
 */
export const GPU_SPEED_PRIOR_MS = 1;
/** Pseudo-passes: a short request, a mid-size state with questions, many code search items, a long state. */
const PRIOR_SHAPES: PassShape[] = [
  { tokens: 160, prefix: 120, branches: 2, width: 20 },
  { tokens: 1_200, prefix: 700, branches: 16, width: 32 },
  { tokens: 4_000, prefix: 200, branches: 12, width: 320 },
  { tokens: 8_000, prefix: 7_000, branches: 8, width: 120 },
];

/** Prediction errors kept: the last this many passes of at least ERROR_MIN_MS estimated. */
const ERROR_WINDOW = 32;
/** Shorter passes are mostly fixed overhead and timer noise, and too short to push a request past its deadline. */
const ERROR_MIN_MS = 200;
/** Fewer errors than this say nothing yet: the overrun reads 1. */
const ERROR_MIN_COUNT = 8;

const features = (s: PassShape): [number, number, number] => [1, s.tokens, attentionPairs(s)];
const estimateWith = (c: CostCoefficients, s: PassShape) => c.perPass + c.perToken * s.tokens + c.perPair * attentionPairs(s);

export class CostModel {
  /** Decayed normal equations of the real passes: Σ w·x·xᵀ and Σ w·x·y (relative error, see accumulate). */
  private readonly xx = [0, 0, 0, 0, 0, 0, 0, 0, 0];
  private readonly xy = [0, 0, 0];
  private priorWeight = PRIOR_WEIGHT;
  /**
   * Decayed Σ w·size and Σ w·size·log(measured / prior estimate), size = the prior's estimate of the
   * pass: how much slower or faster than the prior this machine runs now (a size-weighted geometric mean).
   */
  private ratioWeight = 0;
  private logRatioSum = 0;
  private coef: CostCoefficients;
  /** measured / estimated of recent passes, the estimate taken before the pass taught the model (ring). */
  private readonly errors: number[] = [];
  /** Passes observed so far. */
  passes = 0;

  constructor(
    readonly prior: CostCoefficients,
    private readonly speedPriorMs = SPEED_PRIOR_MS,
  ) {
    this.coef = { ...prior };
  }

  get coefficients(): CostCoefficients {
    return this.coef;
  }

  /** Estimated milliseconds of one pass of this shape. */
  estimate(s: PassShape): number {
    return estimateWith(this.coef, s);
  }

  /** A pass of shape `s` ran in `ms` (inside session.run). */
  observe(s: PassShape, ms: number): void {
    if (!(ms > 0) || !Number.isFinite(ms)) return;
    const predicted = this.estimate(s);
    if (predicted >= ERROR_MIN_MS) {
      this.errors.push(ms / predicted);
      if (this.errors.length > ERROR_WINDOW) this.errors.shift();
    }
    for (let i = 0; i < 9; i++) this.xx[i]! *= FORGET;
    for (let i = 0; i < 3; i++) this.xy[i]! *= FORGET;
    this.priorWeight = Math.max(PRIOR_FLOOR, this.priorWeight * FORGET);
    // The pace is weighed by the pass's size: a 30 ms warm-up pass, mostly fixed overhead, must not
    // scale the estimate of an 8,000-token pass.
    const size = Math.max(1e-6, estimateWith(this.prior, s));
    this.ratioWeight = this.ratioWeight * FORGET + size;
    this.logRatioSum = this.logRatioSum * FORGET + size * Math.log(ms / size);
    this.accumulate(this.xx, this.xy, s, ms, 1);
    this.passes++;
    this.coef = this.fit();
  }

  /**
   * How far recent passes overran their estimates: the q-quantile of
   * measured / estimated over the last ERROR_WINDOW passes (1 until there
   * are ERROR_MIN_COUNT). The fit follows the machine's mean pace; this is
   * its spread, which on a shared 2-core machine reached 1.4–1.7× the
   * estimate for single passes while the mean stayed near 1.
   */
  overrun(q = 0.8): number {
    if (this.errors.length < ERROR_MIN_COUNT) return 1;
    const sorted = [...this.errors].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
  }

  /**
   * Errors count relative to the size of the shape (the prior's estimate,
   * not the time measured, which would favour the faster passes), and each
   * pass counts in proportion to its size up to a second: a stream of tiny
   * passes, mostly fixed overhead, does not outvote the passes that make the
   * queue long.
   */
  private accumulate(xx: number[], xy: number[], s: PassShape, y: number, weight: number): void {
    const x = features(s);
    const size = Math.max(1e-6, estimateWith(this.prior, s));
    const w = (weight * Math.min(1, size / 1000)) / (size * size);
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 3; j++) xx[i * 3 + j]! += w * x[i]! * x[j]!;
      xy[i]! += w * x[i]! * y;
    }
  }

  private fit(): CostCoefficients {
    const xx = [...this.xx];
    const xy = [...this.xy];
    // The pseudo-passes keep the prior's proportions between shapes, at the
    // speed the real passes show: a machine twice as loaded is twice as slow
    // on shapes it has not run lately too.
    const speed = Math.exp(this.logRatioSum / (this.ratioWeight + this.speedPriorMs));
    for (const s of PRIOR_SHAPES) this.accumulate(xx, xy, s, speed * estimateWith(this.prior, s), this.priorWeight);
    // Non-negative least squares over three unknowns: solve on the free set,
    // pin a negative coefficient at zero and solve again.
    const free = [true, true, true];
    for (let round = 0; round < 3; round++) {
      const beta = solve(xx, xy, free);
      if (!beta) break;
      const neg = beta.findIndex((b, i) => free[i] && b < 0);
      if (neg < 0) return { perPass: beta[0]!, perToken: beta[1]!, perPair: beta[2]! };
      free[neg] = false;
    }
    return this.coef;
  }
}

/** Solves the normal equations restricted to the `free` coefficients (the others 0); null when singular. */
function solve(xx: readonly number[], xy: readonly number[], free: readonly boolean[]): number[] | null {
  const idx = [0, 1, 2].filter((i) => free[i]);
  const n = idx.length;
  if (n === 0) return [0, 0, 0];
  // Scale columns so that the system is well conditioned (features span 1 … 1e7).
  const scale = idx.map((i) => Math.sqrt(xx[i * 3 + i]!) || 1);
  const a = idx.map((i, r) => [...idx.map((j, c) => xx[i * 3 + j]! / (scale[r]! * scale[c]!)), xy[i]! / scale[r]!]);
  for (let c = 0; c < n; c++) {
    let piv = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(a[r]![c]!) > Math.abs(a[piv]![c]!)) piv = r;
    if (Math.abs(a[piv]![c]!) < 1e-12) return null;
    [a[c], a[piv]] = [a[piv]!, a[c]!];
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const f = a[r]![c]! / a[c]![c]!;
      for (let k = c; k <= n; k++) a[r]![k]! -= f * a[c]![k]!;
    }
  }
  const out = [0, 0, 0];
  idx.forEach((i, r) => (out[i] = a[r]![n]! / a[r]![r]! / scale[r]!));
  return out;
}
