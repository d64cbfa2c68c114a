import { buildQuestion, closeTurn, label, openTurn, prefixHead, type PromptStyle } from "./index.js";
import type { Question } from "../validate/schema.js";

/**
 * Prompts of the fact check and code search families. Each is one shared
 * prefix (the document, or the query) and one yes/no branch per claim or
 * item, read like a general `noul` question: both casings of yes/no count.
 */

export const YES_NO = { labels: ["yes", "Yes", "no", "No"], option: [0, 0, 1, 1] } as const;

export function yesNoLabels(style: PromptStyle): string[] {
  return YES_NO.labels.map((l) => label(style, l));
}

// ---- fact check -------------------------------------------------------------

// The claim is asked exactly as the general family asks the noul question
// "The document supports this claim: …" about the document (one prompt path:
// buildQuestion), so a fact check name and the general judge on the same build
// read a one-window document alike. With the 1.5B build this wording read
// SummEdits / WiCE at balanced accuracy 0.70 / 0.62 (AUROC 0.76 / 0.64), the
// fact checker's own wording ("Claim: … Is the claim supported by the
// document?" under a fact checker system text) 0.64 / 0.56 (the readout study,
// docs/experiments/readout-study.md).
const CLAIM_QUESTION = "The document supports this claim: ";

/** The general noul question a claim is read as. */
export function claimQuestion(claim: string): Question {
  return { type: "noul", instructions: `${CLAIM_QUESTION}${claim.trim()}` };
}

/** The prefix around a document, for documents cut into token chunks: the general prefix (buildPrefix) in parts. */
export function factcheckPrefixParts(style: PromptStyle): { head: string; tail: string } {
  return { head: prefixHead(style), tail: "\n\n" };
}

/** A claim's yes/no reading (labels: yes, Yes, no, No, as YES_NO). */
export function factcheckClaim(style: PromptStyle, claim: string): string {
  return buildQuestion(style, "claim", claimQuestion(claim)).suffix;
}

/**
 * A claim's second reading, when its question is a statement (isStatement):
 * "true or false?", read over true/false, exactly as the general family reads
 * a `noul` statement. The two readings' log-odds are averaged. Labels are
 * positive first, like YES_NO.
 */
export function factcheckClaimTrueFalse(style: PromptStyle, claim: string): { suffix: string; labels: string[] } {
  const q = buildQuestion(style, "claim", claimQuestion(claim), undefined, { trueFalse: true });
  return { suffix: q.suffix, labels: q.labels };
}

// ---- code search ------------------------------------------------------------

export interface CodeItem {
  id: string;
  path: string;
  kind: string;
  filePreview?: { text: string } | undefined;
  childPreview?: { entries: { name: string; kind: string }[] } | undefined;
}

/**
 * Version of the code search and fact check prompts: cached dev-set scores
 * (`assay calibrate`) are keyed by it, since a fit belongs to the prompt it
 * was fitted under as much as to the weights.
 */
export const FAMILY_PROMPT_VERSION = 6;

// Measured on 5 dev rows (150 items) with the 0.5B build: this framing (a bug
// report, the item as a fenced file, "would you need to look at it") gave
// AUROC 0.645 against 0.509 for a neutral "will the agent need it" wording.
const CODESEARCH_SYSTEM = "You are an expert software engineer triaging a bug report.";

/** The query as the shared prefix: encoded once, every item branches from it. */
export function codesearchPrefix(style: PromptStyle, query: string): string {
  return openTurn(style, CODESEARCH_SYSTEM, `Bug report:\n${query}\n\n`);
}

function describeItem(item: CodeItem): string {
  const what = item.kind === "directory" ? "Folder" : item.kind === "file" ? "File" : `${item.kind[0]!.toUpperCase()}${item.kind.slice(1)}`;
  const lines = [`${what}: \`${item.path}\``];
  if (item.filePreview?.text) lines.push("```", item.filePreview.text, "```");
  if (item.childPreview?.entries?.length) {
    lines.push(`Contains: ${item.childPreview.entries.map((e) => `${e.name}${e.kind === "directory" ? "/" : ""}`).join(", ")}`);
  }
  return lines.join("\n");
}

const noun = (item: CodeItem) => (item.kind === "directory" ? "folder" : item.kind);

export function codesearchItem(style: PromptStyle, item: CodeItem, instructions?: string): string {
  const ask = instructions?.trim();
  const question = ask && ask.length > 0 ? ask : `To fix this bug, would you need to look at this ${noun(item)}?`;
  return closeTurn(style, `${describeItem(item)}\n${question} Answer yes or no.`);
}

/** A string state is used whole, as the task, for every question. */
export function codesearchWholeState(style: PromptStyle, instructions?: string): string {
  const ask = instructions?.trim();
  return closeTurn(style, `${ask && ask.length > 0 ? ask : "Is this relevant to fixing the bug?"} Answer yes or no.`);
}
