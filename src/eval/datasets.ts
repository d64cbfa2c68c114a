/**
 * Dataset readers: the labelled JSONL dev sets (see /work/shared/data/README.md)
 * → typed questions with gold answers. The format is detected from the fields
 * of each file's first row.
 */
import fs from "node:fs";
import path from "node:path";
import type { ChoiceQuestion, NoulQuestion, ScoreQuestion } from "../validate/schema.js";

export type DatasetFormat = "noul" | "choice" | "score" | "factcheck";
/** The question type a format is asked as. */
export type TaskType = "noul" | "choice" | "score";

export const TASK_OF: Record<DatasetFormat, TaskType> = {
  noul: "noul",
  choice: "choice",
  score: "score",
  factcheck: "noul",
};

interface ItemBase {
  id: string;
  /** The request state: the passage / text / document. */
  state: string;
}
export interface NoulItem extends ItemBase {
  type: "noul";
  question: NoulQuestion;
  gold: boolean;
}
export interface ChoiceItem extends ItemBase {
  type: "choice";
  question: ChoiceQuestion;
  options: string[];
  gold: string;
}
export interface ScoreItem extends ItemBase {
  type: "score";
  question: ScoreQuestion;
  levels: string[];
  /** Gold level index, 0 = lowest. */
  gold: number;
}
export type EvalItem = NoulItem | ChoiceItem | ScoreItem;

export interface Dataset {
  /** File name without `.jsonl`, e.g. `choice_agnews`. */
  name: string;
  file: string;
  format: DatasetFormat;
  task: TaskType;
  /** Rows in the file (before `--limit`). */
  totalRows: number;
  items: EvalItem[];
}

/** A file that is not evaluated, and why. */
export class UnsupportedDataset extends Error {
  constructor(
    readonly file: string,
    reason: string,
  ) {
    super(`${file}: ${reason}`);
  }
}

type Row = Record<string, unknown>;

const isStr = (v: unknown): v is string => typeof v === "string";
const isStrArray = (v: unknown): v is string[] => Array.isArray(v) && v.every(isStr);
const has = (r: Row, ...keys: string[]) => keys.every((k) => Object.hasOwn(r, k));

/** Format of one row, from its fields; throws `UnsupportedDataset` for code search or unknown shapes. */
export function detectFormat(row: Row, file = "row"): DatasetFormat {
  if (has(row, "query", "items", "needed")) {
    throw new UnsupportedDataset(
      file,
      "code search rows (query/items/needed) need the codesearch family and their own metrics, which `assay eval` does not cover yet (separate issue)",
    );
  }
  if (has(row, "document", "claim", "supported")) return "factcheck";
  if (has(row, "text", "question", "options", "label")) return "choice";
  if (has(row, "text", "question", "levels", "level")) return "score";
  if (has(row, "text", "question", "answer") && typeof row["answer"] === "boolean") return "noul";
  throw new UnsupportedDataset(file, `unrecognised row fields: ${Object.keys(row).join(", ")}`);
}

function fail(file: string, line: number, msg: string): never {
  throw new Error(`${file}:${line}: ${msg}`);
}

/** One row → one item of the given format (validating the fields it needs). */
export function rowToItem(format: DatasetFormat, row: Row, where: { file: string; line: number }): EvalItem {
  const { file, line } = where;
  const id = isStr(row["id"]) ? row["id"] : `${path.basename(file)}:${line}`;
  switch (format) {
    case "noul": {
      const { text, question, answer } = row;
      if (!isStr(text) || !isStr(question) || typeof answer !== "boolean") fail(file, line, "expected text, question, answer (bool)");
      return { type: "noul", id, state: text, question: { type: "noul", instructions: question }, gold: answer };
    }
    case "factcheck": {
      const { document, claim, supported } = row;
      if (!isStr(document) || !isStr(claim) || typeof supported !== "boolean") {
        fail(file, line, "expected document, claim, supported (bool)");
      }
      return {
        type: "noul",
        id,
        state: document,
        question: { type: "noul", instructions: `The document supports this claim: ${claim}` },
        gold: supported,
      };
    }
    case "choice": {
      const { text, question, options, label } = row;
      if (!isStr(text) || !isStr(question) || !isStrArray(options) || !isStr(label)) {
        fail(file, line, "expected text, question, options (strings), label");
      }
      if (!options.includes(label)) fail(file, line, `label "${label}" is not one of the options`);
      if (new Set(options).size !== options.length) fail(file, line, "options repeat");
      // Optional `descriptions`: what each option means, sent as its criterion.
      const { descriptions } = row;
      if (descriptions !== undefined && (typeof descriptions !== "object" || descriptions === null || Array.isArray(descriptions))) {
        fail(file, line, "descriptions must be an object of option → text");
      }
      const said = (descriptions ?? {}) as Record<string, unknown>;
      const criteria: Record<string, string | null> = {};
      for (const o of options) criteria[o] = isStr(said[o]) ? said[o] : null;
      return { type: "choice", id, state: text, question: { type: "choice", instructions: question, criteria }, options, gold: label };
    }
    case "score": {
      const { text, question, levels, level } = row;
      if (!isStr(text) || !isStr(question) || !isStrArray(levels) || typeof level !== "number") {
        fail(file, line, "expected text, question, levels (strings), level (number)");
      }
      if (!Number.isInteger(level) || level < 0 || level >= levels.length) fail(file, line, `level ${level} is out of range`);
      return {
        type: "score",
        id,
        state: text,
        question: { type: "score", instructions: question, criteria: [...levels] },
        levels,
        gold: level,
      };
    }
  }
}

/**
 * `limit` rows spread evenly over the file (indices ⌊i·n/limit⌋), so that a
 * small limit still covers the classes of files sorted by label.
 */
export function spread<T>(rows: readonly T[], limit: number | undefined): T[] {
  if (limit === undefined || limit >= rows.length) return [...rows];
  const out: T[] = [];
  for (let i = 0; i < limit; i++) out.push(rows[Math.floor((i * rows.length) / limit)]!);
  return out;
}

export function datasetName(file: string): string {
  return path.basename(file).replace(/\.jsonl?$/, "");
}

/** Rows i with i mod `of` = `part` (0-based): disjoint parts of a file, e.g. fit on 0/2, report on 1/2. */
export interface Split {
  part: number;
  of: number;
}

/** "1/2" → {part: 1, of: 2}. */
export function parseSplit(text: string): Split {
  const m = /^(\d+)\/(\d+)$/.exec(text.trim());
  const part = Number(m?.[1]);
  const of = Number(m?.[2]);
  if (!m || !(of >= 1) || !(part >= 0 && part < of)) throw new Error(`split must be PART/PARTS with 0 ≤ PART < PARTS, got "${text}"`);
  return { part, of };
}

/**
 * A score row asked as a choice over its level names (gold: the gold level's name), a set of its own
 * (`<name>@choice`). It gives the choice maps' leave-one-dataset-out gate more than the two choice
 * sets (AG News, BANKING77), which read in different regimes and cannot test each other's map.
 */
function scoreAsChoice(ds: Dataset): Dataset {
  const items = ds.items.map((it): EvalItem => {
    if (it.type !== "score") throw new Error(`${ds.file}: only score rows can be read as choice`);
    const criteria: Record<string, string | null> = {};
    for (const l of it.levels) criteria[l] = null;
    return { type: "choice", id: it.id, state: it.state, question: { type: "choice", instructions: it.question.instructions, criteria }, options: [...it.levels], gold: it.levels[it.gold]! };
  });
  return { ...ds, name: `${ds.name}@choice`, format: "choice", task: "choice", items };
}

/**
 * Read a JSONL dataset file. Throws `UnsupportedDataset` for formats this command does not evaluate.
 * `split` keeps every `of`-th row first; `limit` then spreads over what is left. `readAs` "choice"
 * reads a score file's rows as choice questions over their level names.
 */
export function readDataset(file: string, limit?: number, split?: Split, readAs?: "choice"): Dataset {
  const text = fs.readFileSync(file, "utf8");
  const rows: { row: Row; line: number }[] = [];
  text.split("\n").forEach((l, i) => {
    if (l.trim() === "") return;
    let row: unknown;
    try {
      row = JSON.parse(l);
    } catch (e) {
      fail(file, i + 1, `invalid JSON (${e instanceof Error ? e.message : String(e)})`);
    }
    if (typeof row !== "object" || row === null || Array.isArray(row)) fail(file, i + 1, "a row must be a JSON object");
    rows.push({ row: row as Row, line: i + 1 });
  });
  if (rows.length === 0) throw new UnsupportedDataset(file, "no rows");
  const format = detectFormat(rows[0]!.row, file);
  const kept = split ? rows.filter((_, i) => i % split.of === split.part) : rows;
  const items = spread(kept, limit).map(({ row, line }) => rowToItem(format, row, { file, line }));
  const ids = new Set<string>();
  for (const it of items) {
    if (ids.has(it.id)) throw new Error(`${file}: id "${it.id}" repeats`);
    ids.add(it.id);
  }
  const ds: Dataset = { name: datasetName(file), file, format, task: TASK_OF[format], totalRows: rows.length, items };
  if (readAs === "choice" && format !== "choice") return scoreAsChoice(ds);
  return ds;
}

/**
 * Items that share a state go into one request (at most `maxQuestions`
 * questions), in first-seen order; every other item is a request of its own.
 */
export function groupByState<T extends { state: string }>(items: readonly T[], maxQuestions = 64): T[][] {
  const byState = new Map<string, T[][]>();
  const order: T[][] = [];
  for (const it of items) {
    const chunks = byState.get(it.state);
    const last = chunks?.at(-1);
    if (last && last.length < maxQuestions) {
      last.push(it);
    } else {
      const chunk = [it];
      order.push(chunk);
      if (chunks) chunks.push(chunk);
      else byState.set(it.state, [chunk]);
    }
  }
  return order;
}
