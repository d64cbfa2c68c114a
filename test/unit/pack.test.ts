import { describe, expect, it } from "vitest";
import { pack, packedShape, readLabels, type EncodedQuestion, type PackedRequest } from "../../src/inference/pack.js";
import { shapeOf } from "../../src/inference/cost.js";

/**
 * pack() with hand-made token ids. Token ids are arbitrary numbers; the
 * "logprobs" arrays below are built by hand to check the readout indexing
 * (which cell of the [rows, width] output each label sums), not to stand in
 * for a model.
 */

const TERM = 999;
const q = (suffix: number[], labels: number[][], terminator = TERM): EncodedQuestion => ({ suffix, labels, terminator });
const nums = (a: BigInt64Array) => Array.from(a, Number);

/** Token j is visible from token i iff j <= i <= subtreeEnd[j]. */
const visible = (p: PackedRequest, i: number): number[] => {
  const end = nums(p.subtreeEnd);
  const out: number[] = [];
  for (let j = 0; j <= i; j++) if (i <= end[j]!) out.push(j);
  return out;
};

/** Invariants any packed request must satisfy. */
function checkLayout(p: PackedRequest): void {
  const T = p.inputIds.length;
  expect(p.positionIds.length).toBe(T);
  expect(p.subtreeEnd.length).toBe(T);
  const pos = nums(p.positionIds);
  const end = nums(p.subtreeEnd);
  for (let i = 0; i < T; i++) {
    expect(end[i]!).toBeGreaterThanOrEqual(i);
    expect(end[i]!).toBeLessThan(T);
    const vis = visible(p, i);
    // Each token sees a chain: its position is the number of tokens before it on that chain.
    expect(pos[i]).toBe(vis.length - 1);
    // ... and the chain's positions are 0, 1, ..., pos[i].
    expect(vis.map((j) => pos[j])).toEqual(vis.map((_, k) => k));
  }
  // Branch layout: every token after the prefix sits in exactly one slot of its block's branch.
  const P = p.prefixLength;
  const slots = nums(p.branchSlots);
  const slotOf = nums(p.slotOf);
  expect(slots.length).toBe(p.branches * p.branchWidth);
  expect(slotOf.length).toBe(T - P);
  slotOf.forEach((slot, k) => expect(slots[slot]).toBe(P + k));
  for (let b = 0; b < p.branches; b++) {
    const row = slots.slice(b * p.branchWidth, (b + 1) * p.branchWidth);
    row.forEach((tok, l) => {
      expect(tok).toBeGreaterThanOrEqual(P);
      // A slot is real when slotOf points back at it; a pad slot repeats the branch's first token.
      if (slotOf[tok - P] !== b * p.branchWidth + l) expect(tok).toBe(row[0]);
      // Every token of a branch lies in the subtree of the branch's first token.
      expect(tok).toBeLessThanOrEqual(end[row[0]!]!);
    });
  }
  expect(p.gatherIdx.length).toBe(p.rows);
  expect(p.targetIds.length).toBe(p.rows * p.width);
  for (const g of nums(p.gatherIdx)) expect(g).toBeLessThan(T);
}

describe("layout", () => {
  it("positions restart after the prefix for every question", () => {
    const prefix = [100, 101, 102];
    const p = pack(prefix, [q([200, 201], [[1], [2]]), q([300], [[3], [4]]), q([400, 401, 402], [[5], [6]])]);
    expect(nums(p.inputIds)).toEqual([100, 101, 102, 200, 201, 300, 400, 401, 402]);
    expect(nums(p.positionIds)).toEqual([0, 1, 2, 3, 4, 3, 3, 4, 5]);
    expect(p.prefixLength).toBe(3);
    checkLayout(p);
  });

  it("prefix tokens end at T-1; a question's tokens end at its block end", () => {
    const p = pack([100, 101, 102], [q([200, 201], [[1], [2]]), q([300], [[3], [4]]), q([400, 401, 402], [[5], [6]])]);
    const T = p.inputIds.length;
    expect(T).toBe(9);
    expect(nums(p.subtreeEnd)).toEqual([8, 8, 8, 4, 4, 5, 8, 8, 8]);
    expect(nums(p.subtreeEnd).slice(0, 3)).toEqual([T - 1, T - 1, T - 1]);
  });

  it("a question sees the prefix and its own block, never another question", () => {
    const p = pack([100, 101], [q([200, 201], [[1], [2]]), q([300, 301], [[3], [4]])]);
    // Token 301 (index 5) sees prefix 0,1 and its own 4,5; not 2,3 (question 0).
    expect(visible(p, 5)).toEqual([0, 1, 4, 5]);
    expect(visible(p, 3)).toEqual([0, 1, 2, 3]);
    checkLayout(p);
  });

  it("single-token labels need no extra tokens: one row per question, read at the suffix's last token", () => {
    const p = pack([100, 101], [q([200, 201], [[1], [2], [3]]), q([300], [[4], [5]])]);
    expect(nums(p.inputIds)).toEqual([100, 101, 200, 201, 300]);
    expect(p.rows).toBe(2);
    expect(p.width).toBe(3);
    expect(nums(p.gatherIdx)).toEqual([3, 4]);
    // Row-major [rows, width]; the short row is padded.
    expect(nums(p.targetIds)).toEqual([1, 2, 3, 4, 5, 0]);
    expect(p.readout).toEqual([[[0], [1], [2]], [[3], [4]]]);
  });

  it("width is at least 1 and the widest row decides it", () => {
    const p = pack([1], [q([2], [[10], [11]]), q([3], [[12], [13], [14], [15], [16]])]);
    expect(p.width).toBe(5);
    expect(p.rows).toBe(2);
  });
});

describe("branch layout (split attention)", () => {
  it("one branch per question; slots list the block's tokens, padded with its first token", () => {
    const p = pack([100, 101, 102], [q([200, 201, 202], [[1], [2]]), q([300], [[5, 6], [5, 7]])]);
    // blocks: [200, 201, 202] at 3..5; [300, 5] at 6..7
    expect(nums(p.inputIds)).toEqual([100, 101, 102, 200, 201, 202, 300, 5]);
    expect(p.branches).toBe(2);
    expect(p.branchWidth).toBe(3);
    expect(nums(p.branchSlots)).toEqual([3, 4, 5, 6, 7, 6]);
    expect(nums(p.slotOf)).toEqual([0, 1, 2, 3, 4]);
    checkLayout(p);
  });
});

describe("multi-token labels (trie)", () => {
  it("adds one token per internal trie node, sharing common prefixes once", () => {
    // Labels [5,6], [5,7], [8]: node 5 has children, so it becomes a token;
    // leaves 6, 7, 8 are only read, never fed.
    const p = pack([100, 101, 102], [q([200, 201], [[1], [2]]), q([300], [[5, 6], [5, 7], [8]])]);
    expect(nums(p.inputIds)).toEqual([100, 101, 102, 200, 201, 300, 5]);
    expect(nums(p.positionIds)).toEqual([0, 1, 2, 3, 4, 3, 4]);
    expect(nums(p.subtreeEnd)).toEqual([6, 6, 6, 4, 4, 6, 6]);
    expect(p.rows).toBe(3);
    expect(p.width).toBe(2);
    expect(nums(p.gatherIdx)).toEqual([4, 5, 6]);
    expect(nums(p.targetIds)).toEqual([1, 2, 5, 8, 6, 7]);
    expect(p.readout).toEqual([
      [[0], [1]],
      [[2, 4], [2, 5], [3]],
    ]);
    checkLayout(p);
  });

  it("shared token prefixes of long labels appear once (real key shapes)", () => {
    // Token shapes of card_payment_fee_charged / cash_withdrawal / card_payment_wrong_amount / cash_withdrawal_charge
    const labels = [
      [4951, 26696, 34305, 4138, 92249],
      [41271, 6615, 7633, 278],
      [4951, 26696, 75198, 13471],
      [41271, 6615, 7633, 278, 46008],
    ];
    const p = pack([1, 2], [q([3], labels)]);
    const block = nums(p.inputIds).slice(3);
    // internal nodes: 4951, 26696, 34305, 4138, 75198, 41271, 6615, 7633, 278 (nested: 278 is both an end and a parent)
    // nested labels also feed every label's last token to read the terminator: 92249, 13471, 46008
    expect(block.filter((t) => t === 4951)).toHaveLength(1);
    expect(block.filter((t) => t === 26696)).toHaveLength(1);
    expect(block.filter((t) => t === 41271)).toHaveLength(1);
    expect(block.filter((t) => t === 278)).toHaveLength(1);
    expect(new Set(block).size).toBe(block.length);
    expect(block.sort((a, b) => a - b)).toEqual(
      [4951, 26696, 34305, 4138, 92249, 41271, 6615, 7633, 278, 46008, 75198, 13471].sort((a, b) => a - b),
    );
    checkLayout(p);
    // Each label's readout has one cell per token plus the terminator.
    expect(p.readout[0]!.map((cells) => cells.length)).toEqual([6, 5, 5, 6]);
  });

  it("without nesting, no label token is fed after the label and no terminator is read", () => {
    const labels = [
      [10, 11, 12],
      [10, 11, 13],
      [10, 14],
    ];
    const p = pack([1], [q([2], labels)]);
    // internal nodes: 10, 11 (12, 13, 14 are leaves)
    expect(nums(p.inputIds)).toEqual([1, 2, 10, 11]);
    expect(nums(p.targetIds)).not.toContain(TERM);
    expect(p.readout[0]!.map((cells) => cells.length)).toEqual([3, 3, 2]);
  });

  it("siblings in the trie share a position but cannot see each other", () => {
    // [5,6,7], [5,6,8], [5,9,1]: tokens 5, 6, 9 are fed; 6 and 9 are siblings.
    const p = pack([100], [q([200], [[5, 6, 7], [5, 6, 8], [5, 9, 1]])]);
    expect(nums(p.inputIds)).toEqual([100, 200, 5, 6, 9]);
    expect(nums(p.positionIds)).toEqual([0, 1, 2, 3, 3]);
    expect(nums(p.subtreeEnd)).toEqual([4, 4, 4, 3, 4]);
    expect(visible(p, 4)).toEqual([0, 1, 2, 4]); // 9 sees 100, 200, 5 — not its sibling 6
    expect(visible(p, 3)).toEqual([0, 1, 2, 3]);
    checkLayout(p);
  });

  it("trie tokens of one question stay invisible to the next question", () => {
    const p = pack([100], [q([200], [[5, 6], [5, 7]]), q([300], [[8], [9]])]);
    expect(nums(p.inputIds)).toEqual([100, 200, 5, 300]);
    expect(nums(p.subtreeEnd)).toEqual([3, 2, 2, 3]);
    expect(visible(p, 3)).toEqual([0, 3]);
    checkLayout(p);
  });
});

describe("nested labels read the terminator", () => {
  it("[1] and [1,2]: both labels end with the end-of-turn token", () => {
    const p = pack([100], [q([200], [[1], [1, 2]], 9)]);
    // 1 is both an end and a parent → fed; 2 ends a label in a nested trie → fed too.
    expect(nums(p.inputIds)).toEqual([100, 200, 1, 2]);
    expect(nums(p.positionIds)).toEqual([0, 1, 2, 3]);
    expect(nums(p.subtreeEnd)).toEqual([3, 3, 3, 3]);
    expect(p.rows).toBe(3);
    expect(p.width).toBe(2);
    expect(nums(p.gatherIdx)).toEqual([1, 2, 3]);
    // root reads 1; node 1 reads 2 or the end; node 2 reads the end.
    expect(nums(p.targetIds)).toEqual([1, 0, 2, 9, 9, 0]);
    // "1" = P(1) · P(end | 1); "12" = P(1) · P(2 | 1) · P(end | 1 2)
    expect(p.readout).toEqual([[[0, 3], [0, 2, 4]]]);
    checkLayout(p);
  });

  it("keys 1 / 12 / 123 (digits tokenized one by one)", () => {
    const p = pack([100, 101], [q([200], [[16], [16, 17], [16, 17, 18]], 9)]);
    expect(nums(p.inputIds)).toEqual([100, 101, 200, 16, 17, 18]);
    expect(nums(p.positionIds)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(p.readout[0]!.map((c) => c.length)).toEqual([2, 3, 4]);
    const lp = new Float32Array(p.rows * p.width);
    // row0 (root): [16]; row1 (16): [17, end]; row2 (17): [18, end]; row3 (18): [end]
    expect(nums(p.targetIds)).toEqual([16, 0, 17, 9, 18, 9, 9, 0]);
    lp.set([-0.1, 0, -1, -2, -3, -4, -5, 0]);
    expect(readLabels(p, lp)[0]).toEqual([
      Math.fround(-0.1) + -2, // 16, end
      Math.fround(-0.1) + -1 + -4, // 16, 17, end
      Math.fround(-0.1) + -1 + -3 + -5, // 16, 17, 18, end
    ]);
  });

  it("nesting in one question does not change another question's readout", () => {
    const p = pack([100], [q([200], [[1], [2]]), q([300], [[1], [1, 2]], 9)]);
    expect(p.readout[0]).toEqual([[0], [1]]);
    expect(nums(p.targetIds).slice(0, 2)).toEqual([1, 2]); // no terminator for question 0
    checkLayout(p);
  });
});

describe("readLabels", () => {
  it("sums the right cells of the [rows, width] output", () => {
    const p = pack([100, 101, 102], [q([200, 201], [[1], [2]]), q([300], [[5, 6], [5, 7], [8]])]);
    // rows: 0 = q0 root [1,2]; 1 = q1 root [5,8]; 2 = node 5 [6,7]
    const lp = new Float32Array([-0.5, -1.5, -0.25, -2, -3, -4]);
    const out = readLabels(p, lp);
    expect(out).toEqual([
      [-0.5, -1.5],
      [-0.25 + -3, -0.25 + -4, -2],
    ]);
  });

  it("uses the final width when rows of different questions differ in width", () => {
    // q0: 2 single-token labels (row width 2); q1: 4 labels → width 4.
    const p = pack([1], [q([2], [[10], [11]]), q([3], [[20], [21], [22], [23]])]);
    expect(p.width).toBe(4);
    const lp = new Float32Array(p.rows * p.width).map((_, i) => -(i + 1));
    // q0 reads row 0 cols 0,1 → cells 0,1; q1 row 1 cols 0..3 → cells 4..7.
    expect(readLabels(p, lp)).toEqual([
      [-1, -2],
      [-5, -6, -7, -8],
    ]);
  });
});

describe("token counts", () => {
  it("promptTokens counts prefix + suffixes only, not trie tokens", () => {
    const p = pack([100, 101, 102], [q([200, 201], [[1], [2]]), q([300], [[5, 6], [5, 7], [8]]), q([400], [[1], [1, 2]])]);
    expect(p.promptTokens).toBe(3 + 2 + 1 + 1);
    expect(p.inputIds.length).toBeGreaterThan(p.promptTokens);
  });

  it("a question-free request is only the prefix", () => {
    const p = pack([1, 2, 3], []);
    expect(p.promptTokens).toBe(3);
    expect(p.rows).toBe(0);
    expect(nums(p.subtreeEnd)).toEqual([2, 2, 2]);
  });
});

describe("errors", () => {
  it("a label that encodes to no tokens", () => {
    expect(() => pack([1], [q([2], [[3], []])])).toThrow(/no tokens/);
  });

  it("two labels with the same tokens", () => {
    expect(() => pack([1], [q([2], [[3, 4], [5], [3, 4]])])).toThrow(/same tokens/);
    expect(() => pack([1], [q([2], [[7], [7]])])).toThrow(/same tokens/);
  });

  it("an empty prefix or an empty suffix", () => {
    expect(() => pack([], [q([2], [[3], [4]])])).toThrow(/empty prefix/);
    expect(() => pack([1], [q([], [[3], [4]])])).toThrow(/empty question suffix/);
  });
});

describe("a question's presentations share their stem (group)", () => {
  const g = (suffix: number[], labels: number[][], group: number): EncodedQuestion => ({ suffix, labels, terminator: TERM, group });
  // Four presentations of one question: stem [10, 11, 12], then each its own options.
  const shifts = [
    [10, 11, 12, 21, 22, 23, 24, 30],
    [10, 11, 12, 22, 23, 24, 21, 30],
    [10, 11, 12, 23, 24, 21, 22, 30],
    [10, 11, 12, 24, 21, 22, 23, 30],
  ];
  const prefix = Array.from({ length: 40 }, (_, i) => 100 + i);

  it("the stem is fed once; each presentation continues it and sees only the prefix, the stem and itself", () => {
    const merged = pack(prefix, shifts.map((s) => g(s, [[1], [2], [3], [4]], 0)));
    const apart = pack(prefix, shifts.map((s) => q(s, [[1], [2], [3], [4]])));
    checkLayout(merged);
    expect(merged.inputIds.length).toBe(apart.inputIds.length - 3 * 3);
    expect(merged.branches).toBe(1);
    expect(nums(merged.inputIds).slice(40, 43)).toEqual([10, 11, 12]);
    // The last presentation's answer token: prefix, stem, its own five tokens.
    const last = merged.inputIds.length - 1;
    expect(visible(merged, last).map((j) => Number(merged.inputIds[j]))).toEqual([...prefix, ...shifts[3]!]);
    // Each reads its labels at its own last token, at the position it has alone.
    const rows = nums(merged.gatherIdx);
    expect(rows.map((i) => Number(merged.inputIds[i]))).toEqual([30, 30, 30, 30]);
    expect(rows.map((i) => Number(merged.positionIds[i]))).toEqual(nums(apart.gatherIdx).map((i) => Number(apart.positionIds[i])));
    expect(merged.promptTokens).toBe(apart.promptTokens);
  });

  it("reads every label where the separate layout reads it", () => {
    const labels = [[[5, 6], [5, 7], [8]], [[1], [2]], [[5, 6], [5, 7], [8]], [[1], [2]]];
    const merged = pack(prefix, shifts.map((s, i) => g(s, labels[i]!, 0)));
    const apart = pack(prefix, shifts.map((s, i) => q(s, labels[i]!)));
    checkLayout(merged);
    // The same token at the same position is read for each label, whichever layout.
    const cellsOf = (p: PackedRequest) =>
      p.readout.map((ls) => ls.map((cells) => cells.map((c) => {
        const row = Math.floor(c / p.width);
        const at = Number(p.gatherIdx[row]);
        return [Number(p.inputIds[at]), Number(p.positionIds[at]), Number(p.targetIds[c])];
      })));
    expect(cellsOf(merged)).toEqual(cellsOf(apart));
  });

  it("a presentation keeps at least its last token; different groups never share", () => {
    const p = pack(prefix, [g([10, 11, 12], [[1], [2]], 0), g([10, 11, 12, 13], [[1], [2]], 0), g([10, 11, 12, 14], [[1], [2]], 1)]);
    checkLayout(p);
    // Group 0 shares [10, 11] (the first keeps its 12, where it is read); group 1 is alone.
    expect(nums(p.inputIds).slice(40)).toEqual([10, 11, 12, 12, 13, 10, 11, 12, 14]);
    expect(p.branches).toBe(2);
  });

  it("lays a group out by the group alone: the same block among other questions and in any input order", () => {
    const stem = Array.from({ length: 20 }, (_, i) => 10 + i);
    const long = Array.from({ length: 4 }, (_, k) => [...stem, ...Array.from({ length: 10 }, (_, i) => 200 + ((i + k) % 10))]);
    const shorts = Array.from({ length: 30 }, (_, i) => q([500 + i], [[1], [2]]));
    const alone = pack(prefix, long.map((s) => g(s, [[1], [2]], 0)));
    const among = pack(prefix, [...shorts.slice(0, 15), ...long.map((s) => g(s, [[1], [2]], 0)), ...shorts.slice(15)]);
    checkLayout(among);
    // Shared even where it widens every other block's padding: the planner, not the packer, keeps widths apart.
    expect(alone.branches).toBe(1);
    expect(among.branches).toBe(31);
    expect(among.branchWidth).toBe(alone.branchWidth);
    // The group's block holds the same tokens at the same positions, whatever comes before it.
    const blockOf = (p: PackedRequest, start: number) => [nums(p.inputIds).slice(start, start + alone.branchWidth), nums(p.positionIds).slice(start, start + alone.branchWidth)];
    expect(blockOf(among, prefix.length + 15)).toEqual(blockOf(alone, prefix.length));
    // Presentations in reverse (a scale asked with its levels reversed): the same block, each read where it was.
    const reversed = pack(prefix, [...long].reverse().map((s) => g(s, [[1], [2]], 0)));
    expect(nums(reversed.inputIds)).toEqual(nums(alone.inputIds));
    expect(nums(reversed.subtreeEnd)).toEqual(nums(alone.subtreeEnd));
    expect(reversed.readout).toEqual([...alone.readout].reverse());
  });
});

describe("packedShape: admission's plan of a pass without packing it", () => {
  it("equals the packed request's shape: shared stems, nested and shared label prefixes, mixed groups", () => {
    // A small deterministic generator: suffixes with shared stems inside groups, labels of 1-3 tokens that
    // nest ([5] and [5, 6]) or share prefixes ([5, 6] and [5, 7]).
    let seed = 7;
    const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    const labelSets = [[[1], [2]], [[5, 6], [5, 7], [8]], [[5], [5, 6], [5, 6, 7]], [[1], [2], [3], [4]], [[9, 1], [9, 2], [9, 3, 4]]];
    for (let round = 0; round < 40; round++) {
      const qs: EncodedQuestion[] = [];
      const groups = 1 + rnd(5);
      for (let gi = 0; gi < groups; gi++) {
        const stem = Array.from({ length: rnd(6) }, () => 10 + rnd(50));
        const members = 1 + rnd(4);
        const labels = labelSets[rnd(labelSets.length)]!;
        for (let m = 0; m < members; m++) {
          const rest = Array.from({ length: 1 + rnd(5) }, () => 10 + rnd(50));
          qs.push({ suffix: [...stem, ...rest], labels, terminator: TERM, ...(rnd(3) > 0 ? { group: gi } : {}) });
        }
      }
      const prefixLength = 1 + rnd(30);
      const packed = pack(Array.from({ length: prefixLength }, (_, i) => 100 + i), qs);
      expect(packedShape(prefixLength, qs), `round ${round}`).toEqual(shapeOf(packed));
    }
  });
});
