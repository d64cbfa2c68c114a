import type { Question, State } from "../validate/schema.js";

/**
 * Worked examples shown before the state, as earlier turns of the
 * conversation, on builds whose readout uses them (the calibration file's
 * `demonstrations`). Written for this project, not taken from any data set,
 * and kept off the sanity suite's wording: each teaches the form of an
 * answer, not a topic. The second is a true statement over a negation, the
 * case the readout alone got wrong ("The package did not arrive." read as
 * false of a state saying so); the others cover a JSON state, a false
 * statement, a choice with descriptions and a named scale, so that no label
 * dominates what the model has just seen.
 *
 * The examples are a constant prefix of every general prompt, so a build
 * computes their keys and values once (the engine's preamble) and a request
 * pays only attention to them. Changing a word here changes every reading:
 * the build's maps must be refitted (`assay calibrate`).
 *
 * Shown on neither shipped build: measured on the 1.5B (docs/experiments/readout-study.md), they turn the sanity suite's five negation misses right (all
 * five examples, and the first two alone) but read every dev set worse
 * (BoolQ AUROC 0.754 → 0.737, SummEdits 0.770 → 0.699, AG News 0.76 → 0.74 on
 * the same 100 rows): the examples' short states pull the model away from
 * the long documents real questions are about. Kept, with
 * `assay calibrate --demonstrations on`, so the measurement can be repeated.
 */
export interface Demonstration {
  state: State;
  question: Question;
  /** Option index of the answer shown (noul: 0 = yes, 1 = no). */
  answer: number;
}

export const DEMONSTRATIONS: readonly Demonstration[] = [
  {
    state: "Our flight was not cancelled after all: it left two hours late and we landed just after midnight.",
    question: { type: "noul", instructions: "The flight was not cancelled." },
    answer: 0,
  },
  {
    state: { ticket: 4471, status: "open", assignee: null, priority: "high" },
    question: { type: "noul", instructions: "Has someone been assigned to the ticket?" },
    answer: 1,
  },
  {
    state: "The review meeting starts at ten and runs until noon, with a short break at eleven.",
    question: { type: "noul", instructions: "The meeting ends before eleven." },
    answer: 1,
  },
  {
    state: "I was charged twice for the same order last week. Please send one of the two payments back to my card.",
    question: {
      type: "choice",
      instructions: "Which team should handle this message?",
      criteria: { delivery: "Delivery and tracking", payments: "Payments and refunds", account: "Login and account settings" },
    },
    answer: 1,
  },
  {
    state: "Honestly the worst stay I have had: a dirty room, rude staff, and the heating never worked.",
    question: { type: "score", instructions: "How would the guest rate the stay?", criteria: ["terrible", "poor", "average", "good", "excellent"] },
    answer: 0,
  },
];
