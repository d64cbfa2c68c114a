/**
 * The readout study (issue 18): how a question is asked and read, measured.
 *
 * For every dev row, one packed pass reads many ways of asking the same
 * question as branches of one prefix (system text + state): noul wordings,
 * choice labels (keys, readable keys, numbers, one yes/no branch per option),
 * score labels (names, numbers, one yes/no branch per level, an "upper half"
 * branch). A second pass puts the question before the state (alone, and
 * repeated after it). Every branch is also read against content-free states
 * ("N/A", empty) for contextual calibration. The per-token label
 * log-probabilities are cached on disk, so the analysis (study-report.ts)
 * can compare sums, means and first tokens, priors and calibration maps
 * without running the model again.
 */
import fs from "node:fs";
import path from "node:path";
import { closeTurn, isStatement as isNoulStatement, label, openTurn, renderState, type PromptStyle } from "../prompt/index.js";
import { labelIds, type Engine, type EncodedQuestion, type LoadedBuild } from "../engine/index.js";
import type { Dataset, EvalItem } from "./datasets.js";

/** The fact check family's prompt before issue 18 (its system text, the document first): the study's "fc" baseline. */
const FACTCHECK_SYSTEM =
  "You are a careful fact checker. You read a document and decide whether a claim is fully supported by it. " +
  "A claim is supported only if everything it states can be found in or directly inferred from the document. " +
  "Answer with exactly yes or no.";

function factcheckPrefix(style: PromptStyle, document: string): string {
  return openTurn(style, FACTCHECK_SYSTEM, `Document:\n${document}\n\n`);
}

/** How datasets.ts words a fact check row's claim as a general noul question. */
const CLAIM = "The document supports this claim: ";

/** One read of a question: its labels, the option each label stands for, and what was read. */
export interface Branch {
  /** Variant name. */
  v: string;
  /** Per-option yes/no variants: the option this branch asks about. */
  t?: number;
  /** Option index of each label. */
  option: number[];
  /** Per label, the log-probability of each of its tokens. */
  lps: number[][];
}

export interface StudyRow {
  id: string;
  /** Gold option index (noul: 0 = true, 1 = false). */
  gold: number;
  k: number;
  /** Reads against the real state. */
  branches: Branch[];
  /** Reads against content-free states, keyed by the neutral state. */
  cf: Record<string, Branch[]>;
  /** Engine milliseconds of the main pass, and its packed tokens. */
  ms: number;
  tokens: number;
  /** noul: whether the question is written as a statement (prompt/isStatement); set from the data set when read, not cached. */
  statement?: boolean;
}

interface Ask {
  v: string;
  t?: number;
  suffix: string;
  labels: string[];
  option: number[];
}

const SYSTEM =
  "You are a careful, impartial judge. You read a state (text or JSON) and answer one question about it. " +
  "Answer with exactly one of the allowed labels and nothing else.";

const YES_NO = { labels: ["yes", "Yes", "no", "No"], option: [0, 0, 1, 1] };

export const NEUTRAL_STATES = ["N/A", ""];

function prefixText(style: PromptStyle, body: string): string {
  return openTurn(style, SYSTEM, body);
}

const stateBlock = (state: string) => `State:\n${state}\n\n`;

/** Readable form of an option key: `card_arrival` → `card arrival`. */
export const readable = (key: string) => key.replace(/_/g, " ");

function yesNo(style: PromptStyle, v: string, text: string, t?: number): Ask {
  return { v, ...(t !== undefined ? { t } : {}), suffix: closeTurn(style, text), labels: YES_NO.labels.map((l) => label(style, l)), option: YES_NO.option };
}

/** A statement, not a question (the prompt layer's test): read as true/false as well. */
const isStatement = (q: string) => isNoulStatement({ type: "noul", instructions: q });

const TRUE_FALSE = { labels: ["true", "True", "false", "False"], option: [0, 0, 1, 1] };

/**
 * The question asked with its polarity reversed ("is it false?", "is the answer no?"): a "yes" reads as
 * false. A lean to "no" that comes from the wording (a negation in the statement) pushes this read the
 * other way, so averaged with the upright read it cancels, where a lean from the content does not.
 */
function flipped(style: PromptStyle, v: string, text: string): Ask {
  return { v, suffix: closeTurn(style, text), labels: YES_NO.labels.map((l) => label(style, l)), option: [1, 1, 0, 0] };
}

function trueFalse(style: PromptStyle, v: string, text: string): Ask {
  return { v, suffix: closeTurn(style, text), labels: TRUE_FALSE.labels.map((l) => label(style, l)), option: TRUE_FALSE.option };
}

/** A binary answer as two numbered options, in both orders; option 0 is the first answer word (true). */
function numberedBinary(style: PromptStyle, v: string, head: string, words: [string, string]): Ask[] {
  return [
    [0, 1],
    [1, 0],
  ].map((order) => ({
    v,
    suffix: closeTurn(style, `${head}\nOptions:\n${order.map((o, j) => `${j + 1}. ${words[o]}`).join("\n")}\nAnswer with the option number only.`),
    labels: ["1", "2"].map((l) => label(style, l)),
    option: order.slice(),
  }));
}

/** The head and answer words of the numbered binary reads: as a question (yes/no), as a statement (true/false). */
const YN_NUM = (q: string): [string, [string, string]] => [`Based on the state above, answer the question.\nQuestion: ${q}`, ["yes", "no"]];
const TF_NUM = (q: string): [string, [string, string]] => [`Based on the state above, is the statement true or false?\nStatement: ${q}`, ["true", "false"]];

function cyclic(k: number, maxShifts: number): number[][] {
  const base = Array.from({ length: k }, (_, i) => i);
  const m = k <= maxShifts ? k : 1;
  return Array.from({ length: m }, (_, off) => base.map((_, i) => (i + off) % k));
}

/** The question text of an item, as the caller wrote it. */
function questionOf(it: EvalItem): string {
  return (it.question.instructions ?? "").trim();
}

/** Branches read after the state, sharing the state prefix. */
export function askAfter(style: PromptStyle, it: EvalItem): Ask[] {
  const q = questionOf(it);
  const L = (s: string) => label(style, s);
  switch (it.type) {
    case "noul":
      return [
        yesNo(style, "stmt", `Statement: ${q}\nIs the statement true of the state? Answer yes or no.`),
        yesNo(style, "question", `Question: ${q}\nAnswer yes or no.`),
        yesNo(style, "question_ctx", `Based on the state above, answer the question.\nQuestion: ${q}\nAnswer yes or no.`),
        yesNo(style, "true_false", `Is this true according to the state: ${q}\nAnswer yes or no.`),
        trueFalse(style, "tf", `Based on the state above, is the statement true or false?\nStatement: ${q}\nAnswer true or false.`),
        isStatement(q)
          ? trueFalse(style, "auto", `Based on the state above, is the statement true or false?\nStatement: ${q}\nAnswer true or false.`)
          : yesNo(style, "auto", `Based on the state above, answer the question.\nQuestion: ${q}\nAnswer yes or no.`),
        // A statement asked as what the state says about it (entailment wording), a question as question_ctx:
        // "Question: The package did not arrive. Answer yes or no." invites the "no" that agrees with a negation.
        ...(
          [
            ["auto_sup", "Based on the state above, is the following statement supported by the state?"],
            ["auto_says", "Does the state above say that the following statement is true?"],
            ["auto_agree", "Does the state above agree with the following statement?"],
          ] as const
        ).map(([v, head]) =>
          yesNo(style, v, isStatement(q) ? `${head}\nStatement: ${q}\nAnswer yes or no.` : `Based on the state above, answer the question.\nQuestion: ${q}\nAnswer yes or no.`),
        ),
        flipped(
          style,
          "auto_flip",
          isStatement(q)
            ? `Based on the state above, is the statement false?\nStatement: ${q}\nAnswer yes or no.`
            : `Based on the state above, consider the question.\nQuestion: ${q}\nIs the correct answer to it "no"? Answer yes or no.`,
        ),
        flipped(style, "ctx_flip", `Based on the state above, consider the question.\nQuestion: ${q}\nIs the correct answer to it "no"? Answer yes or no.`),
        // The two answers as numbered options in both orders (read like a choice over all shifts):
        // the number carries no polarity, so "no" to a negated statement is not read as disagreement.
        ...numberedBinary(style, "yn_num", ...YN_NUM(q)),
        ...numberedBinary(style, "tf_num", ...TF_NUM(q)),
        ...numberedBinary(style, "auto_num", ...(isStatement(q) ? TF_NUM(q) : YN_NUM(q))),
      ];
    case "choice": {
      const keys = it.options;
      const k = keys.length;
      const out: Ask[] = [];
      for (const order of cyclic(k, 8)) {
        const list = (f: (i: number) => string) => order.map((i) => f(i)).join("\n");
        out.push({
          v: "keys",
          suffix: closeTurn(style, `Question: ${q}\nOptions:\n${list((i) => `- ${keys[i]}`)}\nAnswer with the option key only.`),
          labels: keys.map(L),
          option: keys.map((_, i) => i),
        });
        if (keys.some((x) => readable(x) !== x)) {
          out.push({
            v: "readable",
            suffix: closeTurn(style, `Question: ${q}\nOptions:\n${list((i) => `- ${readable(keys[i]!)}`)}\nAnswer with the option only.`),
            labels: keys.map((x) => L(readable(x))),
            option: keys.map((_, i) => i),
          });
        }
        // Numbered options: the label is the number shown, so it moves with the order.
        out.push({
          v: "numbers",
          suffix: closeTurn(style, `Question: ${q}\nOptions:\n${order.map((i, j) => `${j + 1}. ${readable(keys[i]!)}`).join("\n")}\nAnswer with the option number only.`),
          labels: order.map((_, j) => L(String(j + 1))),
          option: order.slice(),
        });
      }
      const shown = keys.map(readable).join(", ");
      keys.forEach((key, i) => {
        out.push(yesNo(style, "yesno", `Question: ${q}\nIs the answer "${readable(key)}"? Answer yes or no.`, i));
        // The whole list in every branch costs k² tokens: only for short lists.
        if (k <= 8) out.push(yesNo(style, "yesno_list", `Question: ${q}\nOptions: ${shown}\nIs the answer "${readable(key)}"? Answer yes or no.`, i));
      });
      return out;
    }
    case "score": {
      const lv = it.levels;
      const k = lv.length;
      const up = lv.map((_, i) => i);
      const out: Ask[] = [];
      for (const order of [up, [...up].reverse()]) {
        out.push({
          v: "names",
          suffix: closeTurn(style, `Question: ${q}\nLevels:\n${order.map((i) => `- ${lv[i]}`).join("\n")}\nAnswer with the level name only.`),
          labels: lv.map(L),
          option: up.slice(),
        });
        // Instruct models start an answer with a capital: read both casings of each name, as noul reads yes/Yes.
        const cap = (x: string) => x.charAt(0).toUpperCase() + x.slice(1);
        out.push({
          v: "names_cased",
          suffix: closeTurn(style, `Question: ${q}\nLevels:\n${order.map((i) => `- ${lv[i]}`).join("\n")}\nAnswer with the level name only.`),
          labels: [...lv.map(L), ...lv.filter((x) => cap(x) !== x).map((x) => L(cap(x)))],
          option: [...up, ...up.filter((i) => cap(lv[i]!) !== lv[i])],
        });
        out.push({
          v: "numbers",
          suffix: closeTurn(
            style,
            `Question: ${q}\nLevels, from ${order[0] === 0 ? "lowest to highest" : "highest to lowest"}:\n${order.map((i) => `${i}: ${lv[i]}`).join("\n")}\nAnswer with the level number only.`,
          ),
          labels: up.map((i) => L(String(i))),
          option: up.slice(),
        });
      }
      lv.forEach((name, i) => out.push(yesNo(style, "yesno", `Question: ${q}\nIs the answer "${name}"? Answer yes or no.`, i)));
      out.push(yesNo(style, "upper", `Question: ${q}\nScale: from "${lv[0]}" to "${lv[k - 1]}".\nIs it closer to "${lv[k - 1]}" than to "${lv[0]}"? Answer yes or no.`));
      for (let i = 1; i < k; i++) {
        out.push(yesNo(style, "atleast", `Question: ${q}\nScale, from lowest to highest: ${lv.map((x) => `"${x}"`).join(", ")}.\nIs it "${lv[i]}" or higher? Answer yes or no.`, i));
      }
      return out;
    }
  }
}

/** The question before the state: a prefix of its own, closed alone ("before") or with the question again ("sandwich"). */
export function askBefore(style: PromptStyle, it: EvalItem): { prefix: string; asks: Ask[] } | null {
  const q = questionOf(it);
  const claim = q.startsWith(CLAIM) ? q.slice(CLAIM.length) : null;
  if (it.type === "noul" && claim !== null) {
    // Fact check rows: the family's own prompt (fact checker system text, the document first) against wordings of the claim.
    return {
      prefix: factcheckPrefix(style, it.state),
      asks: [
        yesNo(style, "fc", `Claim: ${claim}\nIs the claim supported by the document? Answer yes or no.`),
        yesNo(style, "fc_q", `Does the document support this claim?\nClaim: ${claim}\nAnswer yes or no.`),
        yesNo(style, "fc_all", `Claim: ${claim}\nIs every part of the claim stated in or directly implied by the document? Answer yes or no.`),
        yesNo(style, "fc_true", `According to the document, is this true? ${claim}\nAnswer yes or no.`),
      ],
    };
  }
  if (it.type === "noul") {
    return {
      prefix: prefixText(style, `Question: ${q}\n\n${stateBlock(renderState(it.state))}`),
      asks: [yesNo(style, "before", "Answer the question above with yes or no."), yesNo(style, "sandwich", `Question: ${q}\nAnswer yes or no.`)],
    };
  }
  if (it.type === "score") {
    const lv = it.levels;
    const intro = `Question: ${q}\nLevels:\n${lv.map((x) => `- ${x}`).join("\n")}\n\n`;
    return {
      prefix: prefixText(style, `${intro}${stateBlock(renderState(it.state))}`),
      asks: [
        { v: "before_names", suffix: closeTurn(style, "Answer with the level name only."), labels: lv.map((x) => label(style, x)), option: lv.map((_, i) => i) },
        {
          v: "sandwich_names",
          suffix: closeTurn(style, `Question: ${q}\nLevels:\n${lv.map((x) => `- ${x}`).join("\n")}\nAnswer with the level name only.`),
          labels: lv.map((x) => label(style, x)),
          option: lv.map((_, i) => i),
        },
      ],
    };
  }
  const keys = it.options;
  if (keys.length > 8) return null;
  const intro = `Question: ${q}\nOptions:\n${keys.map((x) => `- ${x}`).join("\n")}\n\n`;
  return {
    prefix: prefixText(style, `${intro}${stateBlock(renderState(it.state))}`),
    asks: [
      { v: "before_keys", suffix: closeTurn(style, "Answer with the option key only."), labels: keys.map((x) => label(style, x)), option: keys.map((_, i) => i) },
      {
        v: "sandwich_keys",
        suffix: closeTurn(style, `Question: ${q}\nOptions:\n${keys.map((x) => `- ${x}`).join("\n")}\nAnswer with the option key only.`),
        labels: keys.map((x) => label(style, x)),
        option: keys.map((_, i) => i),
      },
    ],
  };
}

/** Runs `asks` against one prefix, in as many passes as the packed-token limit needs. */
async function readAsks(lb: LoadedBuild, engine: Engine, prefixStr: string, asks: readonly Ask[], maxTokens: number): Promise<{ branches: Branch[]; ms: number; tokens: number }> {
  // A variant's presentations (its option orders) are one group, as the served prompt groups a
  // question's presentations: the pack lays a group out behind its shared stem (pack.ts, blocksOf).
  const groups = new Map<string, number>();
  const groupOf = (a: Ask) => {
    const key = `${a.v}\u0000${a.t ?? ""}`;
    if (!groups.has(key)) groups.set(key, groups.size);
    return groups.get(key)!;
  };
  const encoded: EncodedQuestion[] = asks.map((a) => ({
    suffix: lb.tokenizer.encode(a.suffix),
    labels: a.labels.map((l) => labelIds(lb, l)),
    terminator: lb.terminator,
    group: groupOf(a),
  }));
  const { readings, ms, tokens } = await engine.readTokens(lb, lb.tokenizer.encode(prefixStr), encoded, maxTokens);
  const branches = asks.map((a, j): Branch => ({ v: a.v, ...(a.t !== undefined ? { t: a.t } : {}), option: a.option, lps: readings[j]! }));
  return { branches, ms, tokens };
}

function goldOf(it: EvalItem): { gold: number; k: number } {
  if (it.type === "noul") return { gold: it.gold ? 0 : 1, k: 2 };
  if (it.type === "choice") return { gold: it.options.indexOf(it.gold), k: it.options.length };
  return { gold: it.gold, k: it.levels.length };
}

export interface CollectOptions {
  lb: LoadedBuild;
  engine: Engine;
  maxTokens: number;
  /** Also read the question-before-state prefix (one more pass per row). */
  before: boolean;
  /** Read only the variants named here (all when absent). */
  variants?: ReadonlySet<string>;
  /** Read nothing: return the cached rows (the data set still gives each row its form). */
  cachedOnly?: boolean;
  onRow?: () => void;
}

/**
 * Collects a dataset's rows, resuming from `file` (JSONL, one StudyRow a
 * line) when it holds some already. Content-free reads are cached by suffix:
 * a dataset whose question is the same on every row pays for them once.
 */
export async function collectStudy(ds: Dataset, file: string, opts: CollectOptions): Promise<StudyRow[]> {
  const { lb, engine, maxTokens } = opts;
  const rows: StudyRow[] = [];
  const done = new Set<string>();
  if (fs.existsSync(file)) {
    for (const line of fs.readFileSync(file, "utf8").split("\n")) {
      if (!line.trim()) continue;
      const r = JSON.parse(line) as StudyRow;
      rows.push(r);
      done.add(r.id);
    }
  }
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const cfCache = new Map<string, Branch>();
  const wanted = (a: Ask) => !opts.variants || opts.variants.has(a.v);
  for (const it of opts.cachedOnly ? [] : ds.items) {
    if (done.has(it.id)) {
      opts.onRow?.();
      continue;
    }
    const asks = askAfter(lb.style, it).filter(wanted);
    const main = await readAsks(lb, engine, prefixText(lb.style, stateBlock(renderState(it.state))), asks, maxTokens);
    const branches = [...main.branches];
    if (opts.before) {
      const b = askBefore(lb.style, it);
      const before = b?.asks.filter(wanted) ?? [];
      if (b && before.length > 0) branches.push(...(await readAsks(lb, engine, b.prefix, before, maxTokens)).branches);
    }
    const cf: Record<string, Branch[]> = {};
    for (const neutral of NEUTRAL_STATES) {
      const key = (a: Ask) => `${neutral}\u0000${a.suffix}\u0000${a.labels.join("\u0001")}`;
      const missing = asks.filter((a) => !cfCache.has(key(a)));
      if (missing.length > 0) {
        const got = await readAsks(lb, engine, prefixText(lb.style, stateBlock(neutral)), missing, maxTokens);
        missing.forEach((a, i) => cfCache.set(key(a), got.branches[i]!));
      }
      // Two variants can ask the very same text (a question's question_ctx and auto): the read is
      // shared, but each keeps its own name, or the second would shadow the first.
      cf[neutral] = asks.map((a) => ({ ...cfCache.get(key(a))!, v: a.v, ...(a.t !== undefined ? { t: a.t } : {}) }));
    }
    const row: StudyRow = { id: it.id, ...goldOf(it), branches, cf, ms: main.ms, tokens: main.tokens };
    fs.appendFileSync(file, `${JSON.stringify(row)}\n`);
    rows.push(row);
    opts.onRow?.();
  }
  // The form comes from the data set after the file is written, so rows cached before the field existed get it too.
  const form = new Map(ds.items.flatMap((it) => (it.type === "noul" ? [[it.id, isStatement(questionOf(it))] as const] : [])));
  for (const r of rows) if (form.has(r.id)) r.statement = form.get(r.id)!;
  return rows;
}
