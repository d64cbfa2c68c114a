/**
 * The code search score adjustment: `noul` is moved from the model's raw
 * probability so that keeping items with `noul > 0.5` keeps about the target
 * share (95%) of the items an agent needs. It is a shift in log-odds, so it is
 * monotone (raw order is kept) and maps the fitted threshold to exactly 0.5.
 */

import { logit, sigmoid } from "./calibration.js";

export interface RecallFit {
  /** Share of needed items to keep at noul > 0.5. */
  target: number;
  /** Raw probability that maps to 0.5. */
  threshold: number;
}

export function adjustForRecall(raw: number, fit: RecallFit | null | undefined): number {
  if (!fit) return raw;
  return sigmoid(logit(raw) - logit(fit.threshold));
}
