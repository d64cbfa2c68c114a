/**
 * Packs one request into a single sequence for one forward pass.
 *
 *   [ prefix (state) | q0 suffix, q0 label-trie | q1 suffix, q1 trie | ... ]
 *
 * Attention is a tree laid out depth-first: token i sees token j iff j is an
 * ancestor-or-self of i, i.e. `j <= i <= subtreeEnd[j]`. The prefix is a chain
 * whose subtree is everything; each question's block is a chain hanging off
 * the prefix; positions restart after the prefix for every block, so each
 * question sees exactly the tokens it would see alone.
 *
 * A question asked in several presentations (option-order debiasing, a
 * statement's two readings) hangs them off one block: their common leading
 * tokens (the stem: the question's line and the list's start) once, then
 * each presentation's rest as a chain off the stem (`group`, blocksOf).
 * Each still sees the prefix, the stem and its own rest, at the positions it
 * has alone.
 *
 * Labels that need several tokens are scored exactly with a trie: every
 * internal trie node is one more token in its question's block, and the
 * label's log-probability is the sum of its tokens' conditional
 * log-probabilities. When one label is a token-prefix of another, the end of
 * turn token is read after every label so that the events stay disjoint.
 */

export interface EncodedQuestion {
  suffix: number[];
  labels: number[][];
  /** Token that ends the answer (end of turn); used only when labels nest. */
  terminator: number;
  /**
   * Whether the suffix counts in `promptTokens` (default true). The engine's
   * own extra presentations of a question (option-order debiasing) are
   * branches like any other but are not charged: the caller asked one question.
   */
  billed?: boolean;
  /**
   * Branches with the same group (one question's presentations) share a
   * block: their common leading suffix tokens (the stem) are computed once,
   * and each presentation continues it. Each still sees exactly the tokens,
   * at the positions, it would see alone.
   */
  group?: number;
}

/** What the worker feeds to the graph: exactly the graph's inputs. */
export interface PackedTensors {
  inputIds: BigInt64Array;
  positionIds: BigInt64Array;
  subtreeEnd: BigInt64Array;
  gatherIdx: BigInt64Array;
  /** Row-major [rows, width]: token ids read at each gathered position. */
  targetIds: BigInt64Array;
  rows: number;
  width: number;
  /**
   * Branch layout for the split-attention graph: [branches, branchWidth]
   * token indices of each question block (padded by repeating the block's
   * first token), and for each token after the prefix its slot
   * `b * branchWidth + l`.
   */
  branchSlots: BigInt64Array;
  slotOf: BigInt64Array;
  branches: number;
  branchWidth: number;
}

export interface PackedRequest extends PackedTensors {
  /** Per question, per label: flat indices into the [rows, width] output. */
  readout: number[][][];
  /** Tokens of prefix + billed suffixes: what `usage.input_tokens` counts. */
  promptTokens: number;
  prefixLength: number;
}

interface TrieNode {
  token: number;
  children: Map<number, TrieNode>;
  /** Labels ending at this node. */
  ends: number[];
  /** Index in the packed sequence (the root: the suffix's last token). */
  seq: number;
  row: number;
}

function buildTrie(labels: number[][]): { root: TrieNode; nested: boolean } {
  const root: TrieNode = { token: -1, children: new Map(), ends: [], seq: -1, row: -1 };
  labels.forEach((toks, li) => {
    if (toks.length === 0) throw new Error(`label ${li} encodes to no tokens`);
    let node = root;
    for (const t of toks) {
      let next = node.children.get(t);
      if (!next) {
        next = { token: t, children: new Map(), ends: [], seq: -1, row: -1 };
        node.children.set(t, next);
      }
      node = next;
    }
    node.ends.push(li);
  });
  let nested = false;
  const walk = (n: TrieNode): void => {
    if (n.ends.length > 0 && n.children.size > 0) nested = true;
    if (n.ends.length > 1) throw new Error("two labels encode to the same tokens");
    n.children.forEach(walk);
  };
  walk(root);
  return { root, nested };
}

export function pack(prefix: number[], questions: EncodedQuestion[]): PackedRequest {
  if (prefix.length === 0) throw new Error("empty prefix");
  const ids: number[] = [...prefix];
  const pos: number[] = prefix.map((_, i) => i);
  const end: number[] = prefix.map(() => -1); // filled with T-1 at the end
  const gather: number[] = [];
  const targets: number[][] = [];
  const readout: number[][][] = new Array(questions.length);
  let promptTokens = prefix.length;
  const blocks: [number, number][] = [];

  const tries = questions.map((q) => {
    if (q.suffix.length === 0) throw new Error("empty question suffix");
    if (q.billed !== false) promptTokens += q.suffix.length;
    return buildTrie(q.labels);
  });

  // One question's suffix after `from` shared tokens, then its label trie.
  const emitQuestion = (qi: number, from: number): void => {
    const q = questions[qi]!;
    const { root, nested } = tries[qi]!;
    const start = ids.length;
    for (let i = from; i < q.suffix.length; i++) {
      ids.push(q.suffix[i]!);
      pos.push(prefix.length + i);
      end.push(-2); // the question's end, patched below
    }
    root.seq = ids.length - 1;
    const rootPos = prefix.length + q.suffix.length - 1;

    // Depth-first: emit a token for every node that must be read from.
    const needsToken = (n: TrieNode) => n.children.size > 0 || (nested && n.ends.length > 0);
    const emit = (n: TrieNode, depth: number): void => {
      for (const child of n.children.values()) {
        if (!needsToken(child)) continue;
        child.seq = ids.length;
        ids.push(child.token);
        pos.push(rootPos + depth + 1);
        end.push(-3);
        emit(child, depth + 1);
        end[child.seq] = ids.length - 1;
      }
    };
    emit(root, 0);
    for (let i = start; i < start + q.suffix.length - from; i++) end[i] = ids.length - 1;

    // One gathered row per node read from; columns: children, then terminator.
    const colOf = new Map<TrieNode, Map<number, number>>();
    const addRows = (n: TrieNode): void => {
      if (n !== root && !needsToken(n)) return;
      const cols = new Map<number, number>();
      const tgt: number[] = [];
      for (const t of n.children.keys()) {
        cols.set(t, tgt.length);
        tgt.push(t);
      }
      if (nested && n.ends.length > 0) {
        cols.set(-1, tgt.length);
        tgt.push(q.terminator);
      }
      n.row = gather.length;
      gather.push(n.seq);
      targets.push(tgt);
      colOf.set(n, cols);
      n.children.forEach(addRows);
    };
    addRows(root);

    readout[qi] = q.labels.map((toks) => {
      const path: [TrieNode, number][] = [];
      let node = root;
      for (const t of toks) {
        path.push([node, t]);
        node = node.children.get(t)!;
      }
      if (nested) path.push([node, -1]);
      return path.map(([n, t]) => encodeCell(n.row, colOf.get(n)!.get(t)!));
    });
  };

  for (const unit of blocksOf(questions)) {
    const blockStart = ids.length;
    const first = questions[unit.members[0]!]!;
    for (let i = 0; i < unit.stem; i++) {
      ids.push(first.suffix[i]!);
      pos.push(prefix.length + i);
      end.push(-4); // the block's end, patched below
    }
    for (const qi of unit.members) emitQuestion(qi, unit.stem);
    for (let i = blockStart; i < blockStart + unit.stem; i++) end[i] = ids.length - 1;
    blocks.push([blockStart, ids.length - blockStart]);
  }

  const T = ids.length;
  const width = Math.max(1, ...targets.map((t) => t.length));
  const L = Math.max(1, ...blocks.map(([, n]) => n));
  const branchSlots = new BigInt64Array(blocks.length * L);
  const slotOf = new BigInt64Array(T - prefix.length);
  blocks.forEach(([start, n], b) => {
    for (let l = 0; l < L; l++) branchSlots[b * L + l] = BigInt(start + (l < n ? l : 0));
    for (let l = 0; l < n; l++) slotOf[start + l - prefix.length] = BigInt(b * L + l);
  });
  const targetIds = new BigInt64Array(targets.length * width);
  targets.forEach((t, r) => t.forEach((id, c) => (targetIds[r * width + c] = BigInt(id))));
  return {
    inputIds: BigInt64Array.from(ids, BigInt),
    positionIds: BigInt64Array.from(pos, BigInt),
    subtreeEnd: BigInt64Array.from(end, (e) => BigInt(e === -1 ? T - 1 : e)),
    gatherIdx: BigInt64Array.from(gather, BigInt),
    targetIds,
    rows: targets.length,
    width,
    // Cells were encoded as (row, col) pairs before the width was known.
    readout: readout.map((q) => q.map((cells) => cells.map((c) => decodeCell(c, width)))),
    promptTokens,
    prefixLength: prefix.length,
    branchSlots,
    slotOf,
    branches: blocks.length,
    branchWidth: L,
  };
}

/** Tokens a question's label trie adds after its suffix, as `pack` emits them: a node with children, or one that ends a label among nested labels. */
function trieTokens(labels: number[][]): number {
  const { root, nested } = buildTrie(labels);
  let n = 0;
  const walk = (node: TrieNode): void => {
    for (const c of node.children.values()) {
      if (c.children.size === 0 && !(nested && c.ends.length > 0)) continue;
      n++;
      walk(c);
    }
  };
  walk(root);
  return n;
}

/**
 * The shape of `pack(prefix, questions)` for a prefix of `prefixLength`
 * tokens, without building it: what admission plans a pass as (packing a
 * large code search request only to measure it took 10–120 ms of the event
 * loop). The unit test holds it equal to the packed request's.
 */
export function packedShape(prefixLength: number, questions: readonly EncodedQuestion[]): { tokens: number; prefix: number; branches: number; width: number } {
  const lengths = blocksOf(questions).map((b) => b.stem + b.members.reduce((s, i) => s + questions[i]!.suffix.length - b.stem + trieTokens(questions[i]!.labels), 0));
  return { tokens: prefixLength + lengths.reduce((a, b) => a + b, 0), prefix: prefixLength, branches: lengths.length, width: Math.max(1, ...lengths) };
}

/** One block of a pass: question indices in layout order, and the leading suffix tokens they share (computed once). */
export interface Block {
  members: number[];
  stem: number;
}

/** Leading tokens a group's suffixes share; each keeps at least its last suffix token, where its answer is read. */
function stemOf(suffixes: readonly (readonly number[])[]): number {
  if (suffixes.length < 2) return 0;
  const most = Math.min(...suffixes.map((x) => x.length)) - 1;
  let stem = 0;
  while (stem < most && suffixes.every((x) => x[stem] === suffixes[0]![stem])) stem++;
  return stem;
}

/** Branches by `group`, in order of first appearance; an ungrouped branch is a group of its own. */
function groupsOf(questions: readonly EncodedQuestion[], idx: readonly number[]): number[][] {
  const byGroup = new Map<number, number[]>();
  const out: number[][] = [];
  for (const i of idx) {
    const g = questions[i]!.group;
    if (g === undefined) {
      out.push([i]);
      continue;
    }
    const members = byGroup.get(g);
    if (members) members.push(i);
    else {
      const fresh = [i];
      byGroup.set(g, fresh);
      out.push(fresh);
    }
  }
  return out;
}

const byTokens = (a: readonly number[], b: readonly number[]): number => {
  for (let k = 0; k < Math.min(a.length, b.length); k++) if (a[k] !== b[k]) return a[k]! - b[k]!;
  return a.length - b.length;
};

/**
 * The blocks `pack` lays out for the branches `idx` (all when omitted), which
 * the pass planner takes whole (Engine.passesOf). A group (one question's
 * presentations) with a stem is one block: the stem once, then each
 * presentation's rest in token order; any other branch is its own block.
 * Both rules depend on the group alone, never on the rest of the pass: the
 * int8 graph reads a block laid out differently a little differently (a
 * different order of float sums crosses the per-row activation scales'
 * rounding: 0.08–0.13 in log-probability, docs/experiments/packing-and-presentations.md), so a question
 * must be laid out the same alone, among 63 others, with its options in any
 * order, and in any pass of a multi-pass read.
 */
export function blocksOf(questions: readonly EncodedQuestion[], idx: readonly number[] = questions.map((_, i) => i)): Block[] {
  return groupsOf(questions, idx).flatMap((members) => {
    const stem = stemOf(members.map((i) => questions[i]!.suffix));
    if (stem === 0) return members.map((i) => ({ members: [i], stem: 0 }));
    return [{ members: [...members].sort((a, b) => byTokens(questions[a]!.suffix, questions[b]!.suffix)), stem }];
  });
}

// (row, col) packed into one number until the final width is known.
const COLS = 1 << 16;
const encodeCell = (row: number, col: number) => row * COLS + col;
const decodeCell = (cell: number, width: number) => Math.floor(cell / COLS) * width + (cell % COLS);

/** Log-probability of every label of every question from the model output. */
export function readLabels(p: PackedRequest, logprobs: Float32Array): number[][] {
  return p.readout.map((q) =>
    q.map((cells) => {
      let s = 0;
      for (const c of cells) s += logprobs[c]!;
      return s;
    }),
  );
}

/**
 * The pass that continues the first `n` prefix tokens from their keys and
 * values (computed by an earlier pass): the same request without those
 * tokens. Positions stay absolute; sequence indices move down by `n`; the
 * branch layout and the readout are unchanged.
 */
export function continuePacked(p: PackedRequest, n: number): PackedRequest {
  if (n <= 0 || n >= p.prefixLength) throw new Error(`cannot continue ${n} of ${p.prefixLength} prefix tokens`);
  const shift = BigInt(n);
  const down = (a: BigInt64Array) => a.map((x) => x - shift);
  return {
    ...p,
    inputIds: p.inputIds.slice(n),
    positionIds: p.positionIds.slice(n),
    subtreeEnd: down(p.subtreeEnd.subarray(n)),
    gatherIdx: down(p.gatherIdx),
    branchSlots: down(p.branchSlots),
    prefixLength: p.prefixLength - n,
  };
}
