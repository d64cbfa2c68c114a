import { createHash } from "node:crypto";
import type { Question } from "../validate/schema.js";
import type { ConfidenceMap } from "./confidence.js";

/**
 * Confidence maps for one question, fitted on labelled examples of it
 * (`assay calibrate --per-question`). A build's maps are fitted on many kinds
 * of question and must state one probability for one reading; two kinds the
 * model reads alike can be right at very different rates (a dated request read
 * at log-odds 1 is true every time, a WiCE claim a quarter of the time:
 * docs/experiments/answer-quality.md, "What any one map of these readings can
 * do"). A map fitted on the question itself knows which kind it reads. An
 * operator who asks the same question of many states can label a sample of
 * them and have that question's answers stated on its own scale.
 */
export interface QuestionMap {
  type: "noul" | "choice" | "score";
  map: ConfidenceMap;
}

/**
 * The key a question's own map is filed under: a hash of what makes it the
 * same question (type, instructions, criteria). A choice's options are taken
 * in key order: the answer does not depend on the order they are listed in.
 * A score's levels keep theirs: their order is the scale.
 */
export function questionKey(q: Question): string {
  const criteria =
    q.type === "choice"
      ? Object.keys(q.criteria)
          .sort()
          .map((k) => [k, q.criteria[k] ?? null])
      : q.type === "noul"
        ? [q.criteria?.true ?? null, q.criteria?.false ?? null]
        : q.criteria;
  const canonical = JSON.stringify([q.type, q.instructions ?? null, criteria]);
  return createHash("sha256").update(canonical).digest("hex").slice(0, 16);
}
