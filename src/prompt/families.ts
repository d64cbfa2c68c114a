import { closeTurn, label, type PromptStyle } from "./index.js";

/**
 * Prompts of the fact check and code search families. Each is one shared
 * prefix (the document, or the query) and one yes/no branch per claim or
 * item, read like a general `noul` question: both casings of yes/no count.
 */

export const YES_NO = { labels: ["yes", "Yes", "no", "No"], option: [0, 0, 1, 1] } as const;

export function yesNoLabels(style: PromptStyle): string[] {
  return YES_NO.labels.map((l) => label(style, l));
}

function open(style: PromptStyle, system: string, body: string): string {
  if (style.kind === "chatml") return `<|im_start|>system\n${system}${style.end}\n<|im_start|>user\n${body}`;
  return `${system}\n\n${body}`;
}

// ---- fact check -------------------------------------------------------------

const FACTCHECK_SYSTEM =
  "You are a careful fact checker. You read a document and decide whether a claim is fully supported by it. " +
  "A claim is supported only if everything it states can be found in or directly inferred from the document. " +
  "Answer with exactly yes or no.";

/** The document (or one chunk of it) as the shared prefix. */
export function factcheckPrefix(style: PromptStyle, document: string): string {
  return open(style, FACTCHECK_SYSTEM, `Document:\n${document}\n\n`);
}

/** The prefix around a document, for documents cut into token chunks. */
export function factcheckPrefixParts(style: PromptStyle): { head: string; tail: string } {
  return { head: open(style, FACTCHECK_SYSTEM, "Document:\n"), tail: "\n\n" };
}

export function factcheckClaim(style: PromptStyle, claim: string): string {
  return closeTurn(style, `Claim: ${claim.trim()}\nIs the claim supported by the document? Answer yes or no.`);
}

// ---- code search ------------------------------------------------------------

export interface CodeItem {
  id: string;
  path: string;
  kind: string;
  filePreview?: { text: string } | undefined;
  childPreview?: { entries: { name: string; kind: string }[] } | undefined;
}

const CODESEARCH_SYSTEM =
  "You help a coding agent find its way in a repository. Given the agent's task and one file or folder of the " +
  "repository, you decide whether the agent will need to open that file or folder (read it or change it) to " +
  "complete the task. Answer with exactly yes or no.";

/** The query as the shared prefix: encoded once, every item branches from it. */
export function codesearchPrefix(style: PromptStyle, query: string): string {
  return open(style, CODESEARCH_SYSTEM, `Task:\n${query}\n\n`);
}

function describeItem(item: CodeItem): string {
  const lines = [`Candidate ${item.kind === "directory" ? "folder" : item.kind}: ${item.path}`];
  if (item.filePreview?.text) lines.push(`Start of the file:\n${item.filePreview.text}`);
  if (item.childPreview?.entries?.length) {
    lines.push("Contents:");
    for (const e of item.childPreview.entries) lines.push(`- ${e.name}${e.kind === "directory" ? "/" : ""}`);
  }
  return lines.join("\n");
}

export function codesearchItem(style: PromptStyle, item: CodeItem, instructions?: string): string {
  const ask = instructions?.trim();
  const question = ask && ask.length > 0 ? ask : `Will the agent need this ${item.kind === "directory" ? "folder" : "file"}?`;
  return closeTurn(style, `${describeItem(item)}\n\n${question} Answer yes or no.`);
}

/** A string state is used whole, as the task, for every question. */
export function codesearchWholeState(style: PromptStyle, instructions?: string): string {
  const ask = instructions?.trim();
  return closeTurn(style, `${ask && ask.length > 0 ? ask : "Is this relevant to the task?"} Answer yes or no.`);
}
