/** Code search lexical and structural evidence (no model). */
import { describe, expect, it } from "vitest";
import { definedNames, requestEvidence, subwords } from "../../src/prompt/codesearch-features.js";
import type { CodeItem } from "../../src/prompt/families.js";

const file = (id: string, p: string, text = ""): CodeItem => ({ id, path: p, kind: "file", filePreview: { text } });
const folder = (id: string, p: string, entries: string[] = []): CodeItem => ({
  id,
  path: p,
  kind: "directory",
  childPreview: { entries: entries.map((name) => ({ name, kind: name.includes(".") ? "file" : "directory" })) },
});

describe("code search evidence", () => {
  it("reads the classes and functions a preview defines, not private or dunder ones", () => {
    const text = "import re\n\nclass LatexPrinter(Printer):\n    def _print_Mod(self, e):\n        pass\n    def __init__(self):\n        pass\nasync def fetch_all():\n    pass\ndef ab():\n    pass\n";
    expect(definedNames(text).sort()).toEqual(["LatexPrinter", "_print_Mod", "fetch_all"].sort());
  });

  it("splits identifiers into lower-case words at underscores and case changes", () => {
    expect(subwords("parse_duration LatexPrinter x")).toEqual(["parse", "duration", "latex", "printer"]);
  });

  it("finds what the issue names: a dotted module, a path tail, a stem, a defined class", () => {
    const query = "Wrong output from sympy.printing.latex for Mod; see also core/mod.py. The Basic class is fine.";
    const items = [
      file("n0", "sympy/printing/latex.py", "class LatexPrinter:\n    pass\n"),
      file("n1", "sympy/core/mod.py", "class Mod(Function):\n    pass\n"),
      file("n2", "sympy/core/basic.py", "class Basic:\n    pass\n"),
      file("n3", "doc/src/index.rst", "Welcome"),
      folder("n4", "sympy/core", ["mod.py", "basic.py", "numbers.py"]),
      folder("n5", "sympy", ["core", "printing"]),
      folder("n6", "examples", ["intro.py"]),
      file("n7", "sympy/core/__init__.py", ""),
    ];
    const ev = requestEvidence(query, items);
    expect(ev.file[0]).toMatchObject({ pathMention: 1, stemMention: Math.log1p(1), defsMention: 0, source: 1, docPath: 0 });
    expect(ev.file[1]).toMatchObject({ pathMention: 1, defsMention: Math.log1p(1) });
    expect(ev.file[2]!.pathMention).toBe(0);
    expect(ev.file[2]!.defsMention).toBe(Math.log1p(1));
    expect(ev.file[3]).toMatchObject({ source: 0, docPath: 1, pathMention: 0 });
    // A package's __init__ reads as the package: "core" is too generic a stem to count alone.
    expect(ev.file[7]!.stemMention).toBe(0);
    expect(ev.file.filter((f) => f).map((f) => f!.bm25).reduce((a, b) => Math.max(a, b))).toBe(1);
    // mod.py and basic.py are named ("Mod", "Basic"); numbers.py is not.
    expect(ev.folder[4]).toMatchObject({ pathMention: 0, entriesMention: Math.log1p(2) });
    expect(ev.beneath[4]).toEqual([1, 2, 7]);
    expect(ev.beneath[5]).toEqual([0, 1, 2, 7]);
    expect(ev.beneath[6]).toEqual([]);
    expect(ev.folder[5]!.filesBeneath).toBeCloseTo(4 / 5);
    expect(ev.file[4]).toBeNull();
    expect(ev.folder[0]).toBeNull();
  });

  it("does not count a name inside a longer identifier", () => {
    const ev = requestEvidence("call modulus() please", [file("n0", "pkg/mod.py", "")]);
    expect(ev.file[0]!.stemMention).toBe(0);
  });
});
