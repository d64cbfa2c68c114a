import { describe, expect, it } from "vitest";
import { pack, readLabels } from "../../src/inference/pack.js";

describe("unbilled branches (option-order presentations)", () => {
  it("are packed and read like any question but not counted in promptTokens", () => {
    const prefix = [1, 2, 3];
    const labels = [[10], [11]];
    const billed = pack(prefix, [{ suffix: [4, 5], labels, terminator: 99 }]);
    const both = pack(prefix, [
      { suffix: [4, 5], labels, terminator: 99 },
      { suffix: [6, 7, 8], labels, terminator: 99, billed: false },
    ]);
    expect(billed.promptTokens).toBe(5);
    expect(both.promptTokens).toBe(5);
    expect(both.inputIds.length).toBe(8);
    expect(both.branches).toBe(2);
    const lp = readLabels(both, Float32Array.from({ length: both.rows * both.width }, (_, i) => -i));
    expect(lp).toHaveLength(2);
    expect(lp[1]).toHaveLength(2);
  });
});
