/**
 * The output file: append-only JSONL, one record per input line.
 *
 * Resuming reads what is there first. A last line without its newline was cut
 * by an interruption: it is removed (the file is truncated to the end of the
 * last whole line) and that request runs again. A whole line that is not a
 * record is left in place and ignored.
 */
import fs from "node:fs";
import path from "node:path";
import { DUPLICATE_ID, idKey, isOk, type OutRecord } from "./records.js";
import type { InputLine } from "./input.js";

export interface Tally {
  records: number;
  byStatus: Record<string, number>;
  inputTokens: number;
}

export function emptyTally(): Tally {
  return { records: 0, byStatus: {}, inputTokens: 0 };
}

export function addToTally(t: Tally, r: OutRecord): void {
  t.records++;
  t.byStatus[String(r.status)] = (t.byStatus[String(r.status)] ?? 0) + 1;
  if (isOk(r)) t.inputTokens += r.response.usage?.input_tokens ?? 0;
}

export interface ExistingOutput {
  /** Ids with a record (not counting duplicate-id error records). */
  done: Set<string>;
  /** `idKey#line` of duplicate-id error records already written. */
  doneDuplicates: Set<string>;
  tally: Tally;
  /** Bytes of a cut last line that were removed. */
  truncatedBytes: number;
  /** Whole lines that are not records (ignored). */
  invalidLines: number;
}

function isRecord(v: unknown): v is OutRecord {
  if (v === null || typeof v !== "object") return false;
  const r = v as Record<string, unknown>;
  return (
    (typeof r.id === "string" || typeof r.id === "number") &&
    typeof r.status === "number" &&
    typeof r.line === "number" &&
    ("response" in r || "error" in r)
  );
}

/** Read (and repair) an existing output file; an absent file is empty. */
export function readExisting(file: string): ExistingOutput {
  const res: ExistingOutput = { done: new Set(), doneDuplicates: new Set(), tally: emptyTally(), truncatedBytes: 0, invalidLines: 0 };
  if (!fs.existsSync(file)) return res;
  const buf = fs.readFileSync(file);
  const lastNl = buf.lastIndexOf(0x0a);
  const whole = lastNl + 1;
  if (whole < buf.length) {
    res.truncatedBytes = buf.length - whole;
    fs.truncateSync(file, whole);
  }
  const text = buf.subarray(0, whole).toString("utf8");
  for (const line of text.split("\n")) {
    if (line.trim().length === 0) continue;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      res.invalidLines++;
      continue;
    }
    if (!isRecord(v)) {
      res.invalidLines++;
      continue;
    }
    if ("error" in v && v.error?.code === DUPLICATE_ID) res.doneDuplicates.add(`${idKey(v.id)}#${v.line}`);
    else res.done.add(idKey(v.id));
    addToTally(res.tally, v);
  }
  return res;
}

/** Whether an input line already has its record in the output. */
export function isDone(existing: ExistingOutput, l: InputLine): boolean {
  if (l.error?.code === DUPLICATE_ID) return existing.doneDuplicates.has(`${idKey(l.id)}#${l.line}`);
  return existing.done.has(idKey(l.id));
}

/** Appends whole records; each line goes out in one synchronous write. */
export class OutputWriter {
  private readonly fd: number;

  constructor(file: string) {
    fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    this.fd = fs.openSync(file, "a");
  }

  write(r: OutRecord): void {
    fs.writeSync(this.fd, `${JSON.stringify(r)}\n`);
  }

  close(): void {
    fs.fsyncSync(this.fd);
    fs.closeSync(this.fd);
  }
}
