/**
 * What option-order debiasing costs: each dataset's requests are packed with
 * and without the extra presentations and the two engine passes are run
 * alternately on the same lane (so that a busy machine slows both alike).
 * Reports packed tokens, billed tokens and engine time per request.
 */
import type { LoadedBuild } from "../engine/index.js";
import { prepare, readBranches, type PreparedRequest } from "../families/general.js";
import type { EnginePipeline } from "../pipeline/index.js";
import { NO_DEBIAS, type Debias } from "../prompt/index.js";
import type { Question } from "../validate/schema.js";
import { groupByState, type Dataset } from "./datasets.js";
import { mean } from "./metrics.js";

export interface DebiasCost {
  dataset: string;
  requests: number;
  /** Mean packed tokens per request (everything the pass computes). */
  packedOff: number;
  packedOn: number;
  /** Mean `usage.input_tokens` per request (identical by design). */
  billedOff: number;
  billedOn: number;
  /** Median engine time (session.run) per request, ms. */
  msOff: number;
  msOn: number;
  /** Median over requests of the per-request ratio on / off. */
  ratio: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** Inference ms of a prepared request's pass or passes (queueing excluded). */
async function runMs(pipeline: EnginePipeline, lb: LoadedBuild, prepared: PreparedRequest, limit: number): Promise<number> {
  let ms = 0;
  await readBranches(pipeline.engine, lb, prepared, limit, { timings: { add: (phase, t) => void (phase === "inference" && (ms += t)) } });
  return ms;
}

export async function measureDebiasCost(pipeline: EnginePipeline, lb: LoadedBuild, datasets: readonly Dataset[], debias: Debias, limit: number): Promise<DebiasCost[]> {
  const out: DebiasCost[] = [];
  const maxTokens = Math.min(8192, lb.build.manifest.context_length);
  for (const ds of datasets) {
    const rows: { off: number; on: number; pOff: number; pOn: number; bOff: number; bOn: number }[] = [];
    for (const group of groupByState(ds.items, 64).slice(0, limit)) {
      const questions: Record<string, Question> = {};
      for (const it of group) questions[it.id] = it.question;
      const off = prepare(lb, group[0]!.state, questions, undefined, { debias: NO_DEBIAS });
      const on = prepare(lb, group[0]!.state, questions, undefined, { debias });
      // Alternate which goes first, so that neither always runs on a warmer cache.
      const first = rows.length % 2 === 0;
      const a = await runMs(pipeline, lb, first ? off : on, maxTokens);
      const b = await runMs(pipeline, lb, first ? on : off, maxTokens);
      const [msOff, msOn] = first ? [a, b] : [b, a];
      rows.push({
        off: msOff,
        on: msOn,
        pOff: off.packed.inputIds.length,
        pOn: on.packed.inputIds.length,
        bOff: off.packed.promptTokens,
        bOn: on.packed.promptTokens,
      });
    }
    out.push({
      dataset: ds.name,
      requests: rows.length,
      packedOff: mean(rows.map((r) => r.pOff)) ?? NaN,
      packedOn: mean(rows.map((r) => r.pOn)) ?? NaN,
      billedOff: mean(rows.map((r) => r.bOff)) ?? NaN,
      billedOn: mean(rows.map((r) => r.bOn)) ?? NaN,
      msOff: median(rows.map((r) => r.off)),
      msOn: median(rows.map((r) => r.on)),
      ratio: median(rows.map((r) => r.on / r.off)),
    });
  }
  return out;
}

export function debiasCostTable(rows: readonly DebiasCost[], debias: Debias): string {
  const f0 = (x: number) => x.toFixed(0);
  return (
    [
      `| dataset | requests | packed tokens, off | packed tokens, cyclic (≤ ${debias.maxShifts}) | billed tokens, off / cyclic | engine ms, off (median) | engine ms, cyclic (median) | cyclic / off (median of per-request ratios) |`,
      "|---|---:|---:|---:|---:|---:|---:|---:|",
      ...rows.map(
        (r) =>
          `| ${r.dataset} | ${r.requests} | ${f0(r.packedOff)} | ${f0(r.packedOn)} | ${f0(r.billedOff)} / ${f0(r.billedOn)} | ${f0(r.msOff)} | ${f0(r.msOn)} | ${r.ratio.toFixed(2)} |`,
      ),
    ].join("\n") + "\n"
  );
}
