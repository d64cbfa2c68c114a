/**
 * Lexical and structural evidence for code search items, read from the
 * request alone (no model): what the issue text names of an item (its path,
 * module, file stem, the classes and functions its preview defines), how well
 * the item's words match the query (BM25 over the request's own items), and
 * which files of the request lie beneath each folder. Issues name modules,
 * classes, functions and paths far more often than a small model reads them
 * out of a preview, and a needed folder is always one that holds the needed
 * file, so these carry most of what separates items
 * (docs/experiments/codesearch-readings.md).
 */
import type { CodeItem } from "./families.js";

export type FileEvidence = {
  /** The path, as a trailing run of at least two components (`a/b.py`, `a.b`), appears in the query. */
  pathMention: number;
  /** log(1 + times the file's stem appears as a word in the query). */
  stemMention: number;
  /** log(1 + classes and functions defined in the preview that the query names). */
  defsMention: number;
  /** BM25 of the query against the item's path and preview, over the request's files, divided by the request's best. */
  bm25: number;
  /** The same over the path's words alone. */
  bm25Path: number;
  /** 1 for a source file (by extension), 0 for documentation, data and configuration. */
  source: number;
  /** 1 under a documentation, example or CI folder, or at the repository's top level. */
  docPath: number;
};

export type FolderEvidence = {
  /** The folder's path (a trailing run of components, or its last name as a word) appears in the query. */
  pathMention: number;
  /** log(1 + names of its entries the query names). */
  entriesMention: number;
  /** Share of the request's files that lie beneath it. */
  filesBeneath: number;
};

export interface RequestEvidence {
  /** Per item, in request order; exactly one of the two is set. */
  file: (FileEvidence | null)[];
  folder: (FolderEvidence | null)[];
  /** Per folder item, the indices of the request's file items beneath it. */
  beneath: number[][];
}

const isFolder = (it: Pick<CodeItem, "kind">) => it.kind === "directory" || it.kind === "folder";

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** Occurrences of `word` bounded by non-identifier characters (path separators count as bounds). */
function countWord(text: string, word: string, flags = "gi"): number {
  if (!word) return 0;
  const re = new RegExp(`(?<![A-Za-z0-9_])${escapeRe(word)}(?![A-Za-z0-9_])`, flags);
  return (text.match(re) ?? []).length;
}

const GENERIC_STEMS = new Set(["__init__", "index", "main", "core", "base", "utils", "util", "common", "misc", "conf", "setup", "api"]);

/** Path components without the file extension; `pkg/__init__.py` reads as the package. */
function moduleParts(p: string): string[] {
  const parts = p.split("/").filter(Boolean);
  const last = parts.length ? parts[parts.length - 1]! : "";
  const dot = last.lastIndexOf(".");
  if (dot > 0) parts[parts.length - 1] = last.slice(0, dot);
  if (parts.length > 1 && parts[parts.length - 1] === "__init__") parts.pop();
  return parts;
}

/** A trailing run of at least `min` components, joined by `/` or `.`, named in the query. */
function trailingMention(query: string, parts: readonly string[], min: number): number {
  for (let k = parts.length; k >= min; k--) {
    const tail = parts.slice(parts.length - k);
    if (countWord(query, tail.join("/")) > 0 || countWord(query, tail.join(".")) > 0) return 1;
  }
  return 0;
}

const SOURCE_EXT = new Set(["py", "pyx", "pxd", "pyi", "c", "h", "cc", "cpp", "hpp", "js", "mjs", "cjs", "ts", "tsx", "jsx", "go", "rs", "java", "kt", "rb", "php", "cs", "swift", "scala", "m", "jl", "r", "lua", "sh"]);
const DOC_DIRS = /^(?:docs?|examples?|benchmarks?|ci|\.github|tutorials?|doc\/src)\//i;

const DEF_RE = /^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_][A-Za-z0-9_]*)/gm;

/** Classes and functions a preview defines (Python-shaped; other languages add nothing). */
export function definedNames(preview: string): string[] {
  const out = new Set<string>();
  for (const m of preview.matchAll(DEF_RE)) if (m[1]!.length >= 3 && !m[1]!.startsWith("__")) out.add(m[1]!);
  return [...out];
}

/** Words for BM25: identifiers split at `_` and case changes, lower-cased, 2+ letters. */
export function subwords(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/[A-Za-z][A-Za-z0-9]*/g)) {
    for (const w of m[0].split(/(?<=[a-z0-9])(?=[A-Z])/)) {
      const s = w.toLowerCase();
      if (s.length >= 2) out.push(s);
    }
  }
  return out;
}

function bm25(query: readonly string[], docs: readonly string[][], k1 = 1.2, b = 0.75): number[] {
  const n = docs.length;
  if (n === 0) return [];
  const df = new Map<string, number>();
  const tfs = docs.map((d) => {
    const tf = new Map<string, number>();
    for (const w of d) tf.set(w, (tf.get(w) ?? 0) + 1);
    for (const w of tf.keys()) df.set(w, (df.get(w) ?? 0) + 1);
    return tf;
  });
  const avg = docs.reduce((s, d) => s + d.length, 0) / n || 1;
  const qset = [...new Set(query)];
  return tfs.map((tf, i) => {
    let s = 0;
    const len = docs[i]!.length;
    for (const w of qset) {
      const f = tf.get(w);
      if (!f) continue;
      const idf = Math.log(1 + (n - df.get(w)! + 0.5) / (df.get(w)! + 0.5));
      s += (idf * f * (k1 + 1)) / (f + k1 * (1 - b + (b * len) / avg));
    }
    return s;
  });
}

export function requestEvidence(query: string, items: readonly CodeItem[]): RequestEvidence {
  const files = items.flatMap((it, i) => (isFolder(it) ? [] : [i]));
  const qWords = subwords(query);
  // Previews are cut to their first 3,000 characters by the data's builder; a longer one adds words, not evidence.
  const docs = files.map((i) => {
    const it = items[i]!;
    return [...subwords(it.path), ...subwords(it.path), ...subwords((it.filePreview?.text ?? "").slice(0, 3000))];
  });
  const scores = bm25(qWords, docs);
  const best = Math.max(0, ...scores);
  const bm = new Map(files.map((i, k) => [i, best > 0 ? scores[k]! / best : 0]));
  const pathScores = bm25(qWords, files.map((i) => subwords(items[i]!.path)));
  const bestPath = Math.max(0, ...pathScores);
  const bmPath = new Map(files.map((i, k) => [i, bestPath > 0 ? pathScores[k]! / bestPath : 0]));

  const file: (FileEvidence | null)[] = items.map(() => null);
  const folder: (FolderEvidence | null)[] = items.map(() => null);
  const beneath: number[][] = items.map(() => []);
  items.forEach((it, i) => {
    const parts = moduleParts(it.path);
    if (isFolder(it)) {
      const prefix = it.path.replace(/\/+$/, "") + "/";
      beneath[i] = files.filter((j) => items[j]!.path.startsWith(prefix));
      const last = parts[parts.length - 1] ?? "";
      const named = trailingMention(query, parts, Math.min(2, parts.length)) || (!GENERIC_STEMS.has(last) && countWord(query, last) > 0 ? 1 : 0);
      const entries = it.childPreview?.entries ?? [];
      const entryHits = entries.filter((e) => {
        const stem = moduleParts(e.name).pop() ?? "";
        return stem.length >= 3 && !GENERIC_STEMS.has(stem) && countWord(query, stem) > 0;
      }).length;
      folder[i] = { pathMention: named, entriesMention: Math.log1p(entryHits), filesBeneath: files.length ? beneath[i]!.length / files.length : 0 };
      return;
    }
    const stem = parts[parts.length - 1] ?? "";
    const defs = definedNames(it.filePreview?.text ?? "");
    const defHits = defs.filter((d) => countWord(query, d, "g") > 0).length;
    file[i] = {
      pathMention: trailingMention(query, parts, 2),
      stemMention: stem.length >= 3 && !GENERIC_STEMS.has(stem) ? Math.log1p(countWord(query, stem)) : 0,
      defsMention: Math.log1p(defHits),
      bm25: bm.get(i) ?? 0,
      bm25Path: bmPath.get(i) ?? 0,
      source: SOURCE_EXT.has((it.path.split("/").pop() ?? "").split(".").pop()?.toLowerCase() ?? "") ? 1 : 0,
      docPath: DOC_DIRS.test(it.path) || !it.path.includes("/") ? 1 : 0,
    };
  });
  return { file, folder, beneath };
}
