/**
 * The project's files describe the product, not how it was built: no
 * numbered work session (the word followed by a number, a list or a range of
 * numbers), no "(sN)" tag and no "this s-ession" in any tracked text file
 * (source, tests, docs, results). A measurement is labelled by its date,
 * commit and machine instead. onnxruntime's InferenceSession (and "an
 * onnxruntime session") is a technical term and does not match.
 *
 * The patterns are built from pieces so that this file does not match itself.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "..", "..");
const S = "s" + "ession";

/** Each pattern, case-insensitive, with what it catches. */
const PATTERNS: [RegExp, string][] = [
  [new RegExp(`\\b${S}s?\\s+[0-9]`, "i"), "a numbered session"],
  [new RegExp("\\(" + "s[0-9]+\\)", "i"), "a session tag in parentheses"],
  // A tag after a comma or semicolon in prose (an "s", a number, a closing parenthesis); not a
  // code tuple of such names nor an int8 type pair ("u8 × s8" in parentheses).
  [new RegExp("(?<=[,;] )(?<!\\bs[0-9]+[,;] )" + "s[0-9]+\\)", "i"), "a session tag"],
  [new RegExp(`\\bthis\\s+${S}\\b`, "i"), "the current work s" + "ession"],
];

function trackedFiles(): string[] {
  const out = execFileSync("git", ["ls-files", "-z"], { cwd: ROOT, maxBuffer: 64 * 1024 * 1024 });
  return out.toString("utf8").split("\0").filter((f) => f.length > 0);
}

/** Binary files (a NUL byte in the first 8 KiB, as git decides) are the only ones skipped. */
function isBinary(buf: Buffer): boolean {
  return buf.subarray(0, 8192).includes(0);
}

describe("no build-history words in the tracked files", () => {
  it("finds none", () => {
    const hits: string[] = [];
    let read = 0;
    for (const file of trackedFiles()) {
      const full = path.join(ROOT, file);
      if (!fs.existsSync(full) || !fs.statSync(full).isFile()) continue; // deleted in the working tree
      const buf = fs.readFileSync(full);
      if (isBinary(buf)) continue;
      read++;
      // The whole text, so that a number wrapped onto the next line is caught too.
      const text = buf.toString("utf8");
      const lines = text.split("\n");
      for (const [re, what] of PATTERNS) {
        for (const m of text.matchAll(new RegExp(re.source, "gi"))) {
          const line = text.slice(0, m.index).split("\n").length;
          hits.push(`${file}:${line}: ${what}: ${(lines[line - 1] ?? "").trim().slice(0, 160)}`);
        }
      }
    }
    expect(read).toBeGreaterThan(50);
    expect(hits, `label a measurement by its date, commit and machine instead:\n${hits.join("\n")}`).toEqual([]);
  });

  it("the patterns catch what they are for, and not onnxruntime's sessions", () => {
    const match = (s: string) => PATTERNS.some(([re]) => re.test(s));
    for (const bad of [`${S} 12 measured`, `(${S} 4)`, `${S}s 28–30`, "(s" + "17)", "rows, s" + "4)", `as this ${S} found`, `${S}\n 9`]) {
      expect(match(bad), bad).toBe(true);
    }
    for (const ok of ["ort.InferenceSession.create(model)", `each owning onnxruntime ${S}s`, `before it creates a ${S}`, "model.s8s8.onnx", "(u8 × s8)", "torch.cat((s1, s2), dim=-1)"]) {
      expect(match(ok), ok).toBe(false);
    }
  });
});
