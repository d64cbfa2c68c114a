import type { Question, State } from "../validate/schema.js";

/**
 * Prompt layer: state + typed questions → text. Pure functions.
 *
 * A request becomes one shared prefix (instructions + the state) and one
 * suffix per question that ends where the model's answer starts. The answer
 * is read as the next-token distribution over each question's labels, so the
 * suffix tells the model exactly which labels it may answer with.
 */

export type PromptStyle =
  /** ChatML (`<|im_start|>role\n…<|im_end|>`), e.g. Qwen2 instruct models. */
  | { kind: "chatml"; end: string }
  /** A base model without a chat template: plain completion text. */
  | { kind: "completion" };

export function styleFromTemplate(chatTemplate: string | null): PromptStyle {
  if (chatTemplate && chatTemplate.includes("<|im_start|>")) return { kind: "chatml", end: "<|im_end|>" };
  return { kind: "completion" };
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
}

export interface RequestPrompt {
  prefix: string;
  questions: QuestionPrompt[];
}

const SYSTEM =
  "You are a careful, impartial judge. You read a state (text or JSON) and answer one question about it. " +
  "Answer with exactly one of the allowed labels and nothing else.";

export function renderState(state: State): string {
  return typeof state === "string" ? state : JSON.stringify(state);
}

export function buildPrefix(style: PromptStyle, state: State): string {
  const body = `State:\n${renderState(state)}\n\n`;
  if (style.kind === "chatml") {
    return `<|im_start|>system\n${SYSTEM}${style.end}\n<|im_start|>user\n${body}`;
  }
  return `${SYSTEM}\n\n${body}`;
}

export function closeTurn(style: PromptStyle, text: string): string {
  if (style.kind === "chatml") return `${text}${style.end}\n<|im_start|>assistant\n`;
  return `${text}\nAnswer:`;
}

/**
 * Labels that a completion-style prompt reads after "Answer:" carry a leading
 * space; a chat turn starts the answer right after the newline.
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

export function buildQuestion(style: PromptStyle, id: string, q: Question): QuestionPrompt {
  const ask = q.instructions?.trim();
  switch (q.type) {
    case "noul": {
      const lines = [`Statement: ${ask && ask.length > 0 ? ask : "The state is correct and acceptable."}`];
      if (q.criteria?.true) lines.push(`"yes" means: ${q.criteria.true}`);
      if (q.criteria?.false) lines.push(`"no" means: ${q.criteria.false}`);
      lines.push("Is the statement true of the state? Answer yes or no.");
      // Instruct models put most of their mass on "Yes"/"No" whatever the
      // prompt's casing (measured: 75% vs 20% on the lowercase forms), so
      // both casings count for each side.
      return {
        id,
        type: "noul",
        suffix: closeTurn(style, lines.join("\n")),
        labels: ["yes", "Yes", "no", "No"].map((l) => label(style, l)),
        option: [0, 0, 1, 1],
        keys: ["true", "false"],
      };
    }
    case "choice": {
      const keys = Object.keys(q.criteria);
      const lines = [`Question: ${ask && ask.length > 0 ? ask : "Which option fits the state best?"}`, "Options:"];
      for (const k of keys) {
        const d = q.criteria[k];
        lines.push(d === null || d === undefined || d === k ? `- ${k}` : `- ${k}: ${d}`);
      }
      lines.push("Answer with the option key only.");
      return optionQuestion(style, id, "choice", lines, keys);
    }
    case "score": {
      const lines = [
        `Question: ${ask && ask.length > 0 ? ask : "Where does the state fall on this scale?"}`,
        "Levels, from lowest to highest:",
      ];
      const numbers = q.criteria.map((_, i) => String(i));
      if (!shortNames(q.criteria)) {
        q.criteria.forEach((text, i) => lines.push(`${i}: ${text}`));
        lines.push("Answer with the level number only.");
        return optionQuestion(style, id, "score", lines, numbers);
      }
      // Short, distinct level names are read as the answer itself: a small
      // model picks a number by habit (measured on SST-5: the same number for
      // every review), while it reads "very negative" … "very positive" by meaning.
      q.criteria.forEach((text) => lines.push(`- ${text}`));
      lines.push("Answer with the level name only.");
      return { ...optionQuestion(style, id, "score", lines, q.criteria), keys: numbers };
    }
  }
}

export function buildPrompt(style: PromptStyle, state: State, questions: Record<string, Question>): RequestPrompt {
  return {
    prefix: buildPrefix(style, state),
    questions: Object.entries(questions).map(([id, q]) => buildQuestion(style, id, q)),
  };
}
