/** The latency bench's `--cells` filter and percentiles (no model). */
import { describe, expect, it } from "vitest";
import { percentile } from "../../bench/common.js";
import { cellName, parseCells } from "../../bench/latency.js";

describe("bench --cells", () => {
  it("selects the primary cell, the whole matrix, or patterns", () => {
    expect(parseCells("primary").map(cellName)).toEqual(["512x1x4"]);
    expect(parseCells("all")).toHaveLength(36);
    expect(parseCells("512x*x4").map(cellName)).toEqual(["512x1x4", "512x4x4", "512x16x4", "512x64x4"]);
    expect(parseCells("64|2048x1x2,512x1x4").map(cellName)).toEqual(["64x1x2", "2048x1x2", "512x1x4"]);
    expect(parseCells("300x2x3").map(cellName)).toEqual(["300x2x3"]);
    expect(() => parseCells("512x1")).toThrow(/STATExQUESTIONSxOPTIONS/);
    expect(() => parseCells("512x65x4")).toThrow(/limits/);
  });

  it("interpolates percentiles between ranks", () => {
    expect(percentile([1, 2, 3, 4, 5], 50)).toBe(3);
    expect(percentile([10, 20], 95)).toBeCloseTo(19.5);
    expect(percentile([7], 99)).toBe(7);
  });
});
