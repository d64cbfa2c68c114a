import type { Question, State } from "../validate/schema.js";
import { DEMONSTRATIONS } from "./demonstrations.js";
import { ChatTemplate } from "./template.js";

/**
 * Prompt layer: state + typed questions → text. Pure functions.
 *
 * A request becomes one shared prefix (instructions + the state) and one
 * suffix per question that ends where the model's answer starts. The answer
 * is read as the next-token distribution over each question's labels, so the
 * suffix tells the model exactly which labels it may answer with.
 */

export type PromptStyle = (
  /** ChatML (`<|im_start|>role\n…<|im_end|>`), e.g. Qwen2 instruct models. */
  | { kind: "chatml"; end: string }
  /** Any other chat template, rendered by the build's own Jinja (template.ts). */
  | { kind: "template"; chat: ChatTemplate }
  /** A base model without a chat template: plain completion text. */
  | { kind: "completion" }
) & {
  /** Worked examples before the state (demonstrations.ts), where the build's readout was fitted with them. */
  demonstrations?: boolean;
  /**
   * The beginning-of-sequence token's text, written first: the tokenizer
   * adds it by default (transformers' ids start with it) and the template
   * does not write it.
   */
  bos?: string;
};

/** What a style is chosen with besides the template: the build's tokens. */
export interface TemplateTokens {
  /** The manifest's special_tokens (bos, eos, pad), as the template reads them. */
  special?: Record<string, string>;
  /** The beginning-of-sequence token the tokenizer adds by default (TextTokenizer `bos`), if any. */
  bos?: string | undefined;
}

const CHATML_END = "<|im_end|>";
const chatmlOpen = (system: string) => `<|im_start|>system\n${system}${CHATML_END}\n<|im_start|>user\n`;
const CHATML_CLOSE = `${CHATML_END}\n<|im_start|>assistant\n`;

/**
 * The template is rendered with the general system text and a second one, so
 * that its close is known not to depend on the system text and a ChatML
 * rendering is ChatML for any system text.
 */
const PROBE_SYSTEM = "You answer questions.";

/**
 * The prompt style of a build. A template that renders exactly ChatML keeps
 * the `chatml` kind: the shipped Qwen builds' prompts (and the calibrations
 * fitted on them) stay byte for byte what they were before templates were
 * rendered, worked examples included. Any other template that renders a user
 * turn is the `template` kind (no worked examples). A template that does not
 * render keeps the rule from before: ChatML where it writes `<|im_start|>`.
 */
export function styleFromTemplate(chatTemplate: string | null, demonstrations = false, tokens: TemplateTokens = {}): PromptStyle {
  const base = baseStyle(chatTemplate, tokens.special ?? {});
  const withExamples: PromptStyle = demonstrations && base.kind !== "template" ? { ...base, demonstrations: true } : base;
  const bos = tokens.bos;
  if (bos === undefined || bos.length === 0 || preamble(withExamples).startsWith(bos)) return withExamples;
  return { ...withExamples, bos };
}

function baseStyle(chatTemplate: string | null, special: Record<string, string>): PromptStyle {
  if (!chatTemplate) return { kind: "completion" };
  const chat = ChatTemplate.compile(chatTemplate, special, [SYSTEM, PROBE_SYSTEM]);
  if (!chat) return chatTemplate.includes("<|im_start|>") ? { kind: "chatml", end: CHATML_END } : { kind: "completion" };
  const isChatml = [SYSTEM, PROBE_SYSTEM].every((s) => {
    const p = chat.pieces(s);
    return p.open === chatmlOpen(s) && p.close === CHATML_CLOSE;
  });
  return isChatml ? { kind: "chatml", end: CHATML_END } : { kind: "template", chat };
}

export interface QuestionPrompt {
  id: string;
  type: Question["type"];
  suffix: string;
  /** Surface forms the answer is read over. */
  labels: string[];
  /** Option index of each label: an option's probability is the sum over its forms. */
  option: number[];
  /** The option keys (choice), level numbers (score) or true/false (noul), in option order. */
  keys: string[];
  /**
   * Suffixes of the question's other presentations (options shown in other
   * orders, see `presentationOrders`), read over the same labels; absent
   * when the question is asked once.
   */
  variants?: string[];
  /**
   * Option index of each label in each variant, when it differs from
   * `option`: a numbered option list reads the same labels ("1", "2", …)
   * in every presentation, but "1" names another option in each.
   */
  variantOptions?: number[][];
  /** Labels of each variant, when some variant reads other labels than `labels` (a score question's numbered presentations). */
  variantLabels?: string[][];
  /**
   * The suffix with the options in the caller's order, when the first
   * presentation shows them in another: what `usage.input_tokens` counts,
   * so that the charge does not depend on the debias setting.
   */
  billedSuffix?: string;
}

export interface RequestPrompt {
  prefix: string;
  questions: QuestionPrompt[];
}

export const SYSTEM =
  "You are a careful, impartial judge. You read a state (text or JSON) and answer one question about it. " +
  "Answer with exactly one of the allowed labels and nothing else.";

export function renderState(state: State): string {
  return typeof state === "string" ? state : JSON.stringify(state);
}

/**
 * What every general prompt starts with, whatever the state: the system text
 * and, where the build uses them, the worked examples. A constant per build,
 * so the engine computes its keys and values once (Engine, the preamble).
 */
export function preamble(style: PromptStyle): string {
  const bos = style.bos ?? "";
  if (style.kind === "template") return `${bos}${style.chat.pieces(SYSTEM).open}`;
  const turns = style.demonstrations ? DEMONSTRATIONS.map((d) => demonstrationTurn(style, d.state, d.question, d.answer)).join("") : "";
  if (style.kind === "chatml") return `${bos}<|im_start|>system\n${SYSTEM}${style.end}\n${turns}`;
  return `${bos}${SYSTEM}\n\n${turns}`;
}

/** The general prefix up to the state's text: the preamble and the opening of the user's turn. */
export function prefixHead(style: PromptStyle): string {
  return `${preamble(style)}${style.kind === "chatml" ? "<|im_start|>user\n" : ""}State:\n`;
}

export function buildPrefix(style: PromptStyle, state: State): string {
  return `${prefixHead(style)}${renderState(state)}\n\n`;
}

/**
 * A prompt under another system text than the general one (fact check, code
 * search, the readout study): the system turn and the user's turn opened on
 * `body`. No worked examples: they belong to the general prompt.
 */
export function openTurn(style: PromptStyle, system: string, body: string): string {
  const bos = style.bos ?? "";
  if (style.kind === "chatml") return `${bos}<|im_start|>system\n${system}${style.end}\n<|im_start|>user\n${body}`;
  if (style.kind === "template") return `${bos}${style.chat.pieces(system).open}${body}`;
  return `${bos}${system}\n\n${body}`;
}

/** One worked example as a finished exchange: the question asked as buildQuestion asks it, and its answer label. */
function demonstrationTurn(style: PromptStyle, state: State, q: Question, answer: number): string {
  const asked = buildQuestion(style, "example", q, undefined, { debiased: true });
  const shown = asked.labels[asked.option.indexOf(answer)]!;
  const text = `State:\n${renderState(state)}\n\n${asked.suffix}${shown}`;
  return style.kind === "chatml" ? `<|im_start|>user\n${text}${style.end}\n` : `${text}\n\n`;
}

export function closeTurn(style: PromptStyle, text: string): string {
  if (style.kind === "chatml") return `${text}${style.end}\n<|im_start|>assistant\n`;
  if (style.kind === "template") return `${text}${style.chat.close}`;
  return `${text}\nAnswer:`;
}

/**
 * Labels that a completion-style prompt reads after "Answer:" carry a leading
 * space; a chat turn starts the answer right after the generation prompt.
 */
export function label(style: PromptStyle, text: string): string {
  return style.kind === "completion" ? ` ${text}` : text;
}

/** Level names short enough to answer with, and distinct. */
function shortNames(levels: readonly string[]): boolean {
  const trimmed = levels.map((l) => l.trim());
  return trimmed.every((l) => l.length > 0 && l.length <= 40 && !l.includes("\n")) && new Set(trimmed).size === levels.length &&
    trimmed.every((l, i) => l === levels[i]);
}

/** A question whose labels are its option keys, one form each. */
function optionQuestion(style: PromptStyle, id: string, type: "choice" | "score", lines: string[], keys: string[]): QuestionPrompt {
  return {
    id,
    type,
    suffix: closeTurn(style, lines.join("\n")),
    labels: keys.map((k) => label(style, k)),
    option: keys.map((_, i) => i),
    keys,
  };
}

/**
 * A question whose options are listed as `1. …`, `2. …` in `shown` order and
 * read by the number shown: label j is option shown[j].
 */
function numberedQuestion(
  style: PromptStyle,
  id: string,
  type: "choice" | "score",
  lines: string[],
  shown: readonly number[],
  text: (i: number) => string,
  keys: string[],
): QuestionPrompt {
  shown.forEach((i, j) => lines.push(`${j + 1}. ${text(i)}`));
  lines.push(type === "choice" ? "Answer with the option number only." : "Answer with the number of the level only.");
  return {
    id,
    type,
    suffix: closeTurn(style, lines.join("\n")),
    labels: shown.map((_, j) => label(style, String(j + 1))),
    option: shown.slice(),
    keys,
  };
}

/**
 * One question's prompt. `order` lists the option (or level) indices in the
 * order they are shown; labels, keys and option indices never move, so every
 * presentation of a question is read back over the same labels.
 */
export function buildQuestion(
  style: PromptStyle,
  id: string,
  q: Question,
  order?: readonly number[],
  opts: { debiased?: boolean; positions?: boolean; trueFalse?: boolean } = {},
): QuestionPrompt {
  const ask = q.instructions?.trim();
  switch (q.type) {
    case "noul": {
      const text = noulText(q);
      // Asked as a question about the state, whether the instructions are a
      // question or a statement: "Statement: … Is the statement true of the
      // state?" read near chance on BoolQ and on fact check claims with the
      // 1.5B build (the readout study, docs/experiments/readout-study.md). A
      // statement's second reading (`trueFalse`) asks "true or false", where
      // "no" to a negated statement would also be how a speaker agrees with
      // it ("The package did not arrive." — "No.").
      const [yes, no] = opts.trueFalse ? ["true", "false"] : ["yes", "no"];
      const lines = opts.trueFalse
        ? ["Based on the state above, is the statement true or false?", `Statement: ${text}`]
        : ["Based on the state above, answer the question.", `Question: ${text}`];
      if (q.criteria?.true) lines.push(`"${yes}" means: ${q.criteria.true}`);
      if (q.criteria?.false) lines.push(`"${no}" means: ${q.criteria.false}`);
      lines.push(`Answer ${yes} or ${no}.`);
      // Instruct models put most of their mass on "Yes"/"No" whatever the
      // prompt's casing (measured: 75% vs 20% on the lowercase forms), so
      // both casings count for each side.
      const cap = (w: string) => w[0]!.toUpperCase() + w.slice(1);
      return {
        id,
        type: "noul",
        suffix: closeTurn(style, lines.join("\n")),
        labels: [yes, cap(yes), no, cap(no)].map((l) => label(style, l)),
        option: [0, 0, 1, 1],
        keys: ["true", "false"],
      };
    }
    case "choice": {
      const keys = Object.keys(q.criteria);
      const shown = order ?? keys.map((_, j) => j);
      const lines = [`Question: ${ask && ask.length > 0 ? ask : "Which option fits the state best?"}`, "Options:"];
      const line = (i: number) => {
        const k = keys[i]!;
        const d = q.criteria[k];
        return d === null || d === undefined || d === k ? k : `${k}: ${d}`;
      };
      if (keys.length <= NUMBERED_MAX_OPTIONS) {
        // Up to 8 options are numbered and the number is read: "1" … "k" are
        // short, distinct and read alike for every option, and the lean to a
        // number cancels over the cyclic shifts (all k are shown for k ≤ 8).
        // Measured in docs/experiments/readout-study.md.
        return numberedQuestion(style, id, "choice", lines, shown, line, keys);
      }
      // More options are shown once (canonical order): a number would carry
      // its position's lean uncorrected, so the key itself is read (and the
      // content-free prior takes out the lean to a key).
      for (const i of shown) lines.push(`- ${line(i)}`);
      lines.push("Answer with the option key only.");
      return optionQuestion(style, id, "choice", lines, keys);
    }
    case "score": {
      const shown = order ?? q.criteria.map((_, i) => i);
      const descending = shown.length > 1 && shown.every((i, j) => i === shown.length - 1 - j);
      const named = shortNames(q.criteria);
      const lines = [
        `Question: ${ask && ask.length > 0 ? ask : "Where does the state fall on this scale?"}`,
        // Debiased named levels carry no direction word: the two presentations
        // (up, down) are then the same pair of texts for a scale and for its
        // reverse, so the answer cannot depend on which way the caller wrote it.
        // The names carry their meaning; the caller's order only sets the numbers.
        named && opts.debiased ? "Levels:" : descending ? "Levels, from highest to lowest:" : "Levels, from lowest to highest:",
      ];
      const numbers = q.criteria.map((_, i) => String(i));
      if (!named) {
        for (const i of shown) lines.push(`${i}: ${q.criteria[i]!}`);
        lines.push("Answer with the level number only.");
        return optionQuestion(style, id, "score", lines, numbers);
      }
      if (opts.positions) {
        // The levels numbered by where they are listed, the number read: the
        // same texts for a scale and for its reverse (numbers follow the
        // list, not the caller's level numbers), so the answer stays mirrored.
        lines[1] = "Levels:";
        return numberedQuestion(style, id, "score", lines, shown, (i) => q.criteria[i]!, numbers);
      }
      // Short, distinct level names are read as the answer itself, by meaning.
      for (const i of shown) lines.push(`- ${q.criteria[i]!}`);
      lines.push("Answer with the level name only.");
      return { ...optionQuestion(style, id, "score", lines, q.criteria), keys: numbers };
    }
  }
}

/**
 * Option-order debiasing (ASSAY_DEBIAS). A question is asked once per
 * presentation order, as extra branches of the same packed pass, and its
 * readings are averaged (src/probability `averageReadings`).
 *
 * - `choice`: the options are first put in a canonical order (by key, code
 *   unit order), then shown in all k cyclic shifts of it when k ≤ maxShifts:
 *   every option visits every position once, which cancels a bias that the
 *   model adds to a position. With more options than that, only the
 *   canonical order is shown: a partial set of shifts does not cancel the
 *   bias and costs a full option list per shift (measured on BANKING77, 77
 *   options: 2 shifts gave the same accuracy as 1 at 4× the time, see
 *   docs/experiments/answer-quality.md). Either way the set of presentations depends only on
 *   the set of options, so the answer cannot depend on the order the caller
 *   wrote them in.
 * - `score`: levels are ordered by meaning, so they are not rotated; they are
 *   shown low → high and high → low (maxShifts ≥ 2), which cancels a lean
 *   towards the first or last listed level. Named levels are then listed
 *   under a header without a direction (see buildQuestion).
 * - `noul`: one presentation (yes/no have no order to remove).
 */
export interface Debias {
  mode: "off" | "cyclic";
  /** Presentations per question at most (≥ 1). */
  maxShifts: number;
}

export const NO_DEBIAS: Debias = Object.freeze({ mode: "off", maxShifts: 1 });

/**
 * The default (ASSAY_DEBIAS=cyclic, ASSAY_DEBIAS_MAX_SHIFTS=8; the figures
 * behind it are in docs/experiments/answer-quality.md): all shifts for up to 8
 * options, the canonical order alone above that.
 */
export const DEFAULT_DEBIAS: Debias = Object.freeze({ mode: "cyclic", maxShifts: 8 });

/**
 * A choice question with at most this many options is numbered and read by
 * number; with more, by key. It depends on the option count alone (not on
 * ASSAY_DEBIAS), so what is billed does not depend on the debias setting.
 */
export const NUMBERED_MAX_OPTIONS = 8;

function noulText(q: Question): string {
  const ask = q.instructions?.trim();
  return ask && ask.length > 0 ? ask : "The state is correct and acceptable.";
}

/** A noul question written as a statement, not a question: it is also read as true/false. */
export function isStatement(q: Question): boolean {
  return q.type === "noul" && !noulText(q).endsWith("?");
}

/** The orders a question is shown in under `debias`; the first one is the one billed. */
export function presentationOrders(q: Question, debias: Debias): number[][] {
  if (q.type === "noul") return [[]];
  const k = q.type === "choice" ? Object.keys(q.criteria).length : q.criteria.length;
  const natural = Array.from({ length: k }, (_, i) => i);
  if (debias.mode === "off") return [natural];
  const max = Math.max(1, Math.floor(debias.maxShifts));
  if (q.type === "score") return max >= 2 ? [natural, [...natural].reverse()] : [natural];
  const keys = Object.keys(q.criteria);
  const canon = [...natural].sort((a, b) => (keys[a]! < keys[b]! ? -1 : keys[a]! > keys[b]! ? 1 : 0));
  const m = k <= max ? k : 1;
  return Array.from({ length: m }, (_, off) => canon.map((_, i) => canon[(i + off) % k]!));
}

export function buildPrompt(
  style: PromptStyle,
  state: State,
  questions: Record<string, Question>,
  debias: Debias = NO_DEBIAS,
): RequestPrompt {
  return {
    prefix: buildPrefix(style, state),
    questions: Object.entries(questions).map(([id, q]) => {
      const [first, ...rest] = presentationOrders(q, debias);
      const debiased = debias.mode !== "off";
      const main = buildQuestion(style, id, q, q.type === "noul" ? undefined : first, { debiased });
      const others = rest.map((o) => buildQuestion(style, id, q, o, { debiased }));
      // Named score levels are also read by their listed position, both ways
      // (the readout study, docs/experiments/readout-study.md: names and numbers
      // err differently, and their average beats either).
      if (debiased && q.type === "score" && shortNames(q.criteria) && rest.length > 0) {
        for (const o of [first!, ...rest]) others.push(buildQuestion(style, id, q, o, { debiased, positions: true }));
      }
      // A statement is read both as a yes/no question and as true/false, and
      // the two averaged (the readout study, docs/experiments/readout-study.md).
      if (isStatement(q)) others.push(buildQuestion(style, id, q, undefined, { trueFalse: true }));
      const plain = debiased ? buildQuestion(style, id, q).suffix : main.suffix;
      const own = plain === main.suffix ? null : plain;
      // The labels are read in a canonical order too (sorted by text), so
      // that the packed label trie, and with it the arithmetic, is the same
      // whatever order the caller wrote the options in.
      const sortLabels = (labels: string[]) => labels.map((_, i) => i).sort((a, b) => (labels[a]! < labels[b]! ? -1 : 1));
      const canonical = debias.mode !== "off" && q.type !== "noul";
      const canon = canonical ? sortLabels(main.labels) : null;
      const reorder = (option: number[]) => (canon ? canon.map((i) => option[i]!) : option);
      const sameLabels = others.every((v) => v.labels.length === main.labels.length && v.labels.every((l, i) => l === main.labels[i]));
      // Variants with labels of their own carry them (sorted the same way) with their option maps.
      const own2 = others.map((v) => {
        const c = canonical ? sortLabels(v.labels) : v.labels.map((_, i) => i);
        return { labels: c.map((i) => v.labels[i]!), option: c.map((i) => v.option[i]!) };
      });
      const moved = !sameLabels || others.some((v) => v.option.some((o, i) => o !== main.option[i]));
      return {
        ...main,
        ...(canon ? { labels: canon.map((i) => main.labels[i]!), option: reorder(main.option) } : {}),
        ...(others.length > 0 ? { variants: others.map((v) => v.suffix) } : {}),
        ...(moved ? { variantOptions: sameLabels ? others.map((v) => reorder(v.option)) : own2.map((v) => v.option) } : {}),
        ...(!sameLabels ? { variantLabels: own2.map((v) => v.labels) } : {}),
        ...(own !== null ? { billedSuffix: own } : {}),
      };
    }),
  };
}
