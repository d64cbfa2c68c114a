/** The code search reading (request-level map) and its offline fit (no model). */
import { describe, expect, it } from "vitest";
import { fitLogistic } from "../../bench/codesearch-fit.js";
import { logit } from "../../src/probability/calibration.js";
import { CodeSearchReading, readRequest, readingNoul, type ItemEvidence } from "../../src/probability/codesearch-reading.js";

const reading: CodeSearchReading = {
  file: { bias: 0, weights: { raw: 1, bm25: 2 } },
  share: { bias: 1, weights: { logShare: 1 } },
  folder: { bias: 0, weights: { childShare: 2 } },
  recall: { target: 0.95, threshold: 0.2 },
};

// Three files (0, 1, 2) and two folders: 3 holds files 0 and 1, 4 holds none.
const ev: ItemEvidence = {
  file: [{ bm25: 1 }, { bm25: 0.5 }, { bm25: 0 }, null, null],
  folder: [null, null, null, { pathMention: 0 }, { pathMention: 0 }],
  beneath: [[], [], [], [0, 1], []],
};

describe("code search reading", () => {
  it("reads files by their share of the request and folders by the shares beneath them", () => {
    const raw = [0.6, 0.6, 0.6, 0.5, 0.5];
    const { p, inputs } = readRequest(ev, raw, reading);
    const s = [logit(0.6) + 2, logit(0.6) + 1, logit(0.6)];
    const lse = Math.log(s.reduce((a, x) => a + Math.exp(x), 0));
    for (let i = 0; i < 3; i++) expect(p[i]).toBeCloseTo(1 / (1 + Math.exp(-(1 + s[i]! - lse))), 12);
    const shares = s.map((x) => Math.exp(x - lse));
    expect(inputs.folderX[3]!.childShare).toBeCloseTo(Math.log(shares[0]! + shares[1]! + 1e-3), 12);
    expect(p[3]).toBeGreaterThan(p[4]!);
    expect(p[0]).toBeGreaterThan(p[1]!);
    expect(p[1]).toBeGreaterThan(p[2]!);
  });

  it("depends on the other items: the same file reads lower beside a stronger one", () => {
    const alone = readRequest({ file: [{ bm25: 0.5 }], folder: [null], beneath: [[]] }, [0.6], reading).p[0]!;
    const beside = readRequest({ file: [{ bm25: 0.5 }, { bm25: 1 }], folder: [null, null], beneath: [[], []] }, [0.6, 0.9], reading).p[0]!;
    expect(beside).toBeLessThan(alone);
  });

  it("leaves an item that was not scored (NaN raw) out of the shares", () => {
    const { p } = readRequest(ev, [0.6, Number.NaN, 0.6, 0.5, 0.5], reading);
    expect(p[1]).toBeNaN();
    expect(Number.isFinite(p[0]!)).toBe(true);
  });

  it("maps the recall threshold to 0.5, monotonically", () => {
    expect(readingNoul(0.2, reading)).toBeCloseTo(0.5, 12);
    expect(readingNoul(0.3, reading)).toBeGreaterThan(0.5);
    expect(readingNoul(0.1, reading)).toBeLessThan(0.5);
  });

  it("parses as the calibration file's section and refuses a reading without its threshold", () => {
    expect(CodeSearchReading.safeParse(reading).success).toBe(true);
    expect(CodeSearchReading.safeParse({ ...reading, recall: undefined }).success).toBe(false);
  });

  it("fits a logistic map that recovers the direction of the evidence", () => {
    const x: Record<string, number>[] = [];
    const y: boolean[] = [];
    let seed = 7;
    const rand = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
    for (let i = 0; i < 2000; i++) {
      const a = rand() * 4 - 2;
      const b = rand() * 4 - 2;
      x.push({ a, b });
      y.push(rand() < 1 / (1 + Math.exp(-(2 * a - b - 0.5))));
    }
    const fit = fitLogistic(x, y, ["a", "b"], 0.01);
    expect(fit.weights.a).toBeCloseTo(2, 0);
    expect(fit.weights.b).toBeCloseTo(-1, 0);
    expect(fit.bias).toBeCloseTo(-0.5, 0);
  });
});
