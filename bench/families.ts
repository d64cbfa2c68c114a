/**
 * `npm run bench -- families`: latency per request of the code search and
 * fact check names on dev rows, against the naive baseline on the same
 * build in the same run: every item (claim) sent as its own request, so the
 * query (document) is encoded once per item instead of once per request.
 */
import path from "node:path";
import { ROOT, loadConfig } from "../src/config/index.js";
import { codeSearchRequests, factCheckRequests, readCodeSearch, readFactCheck, spreadRows } from "../src/eval/family-fit.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { RequestEnvelope } from "../src/validate/schema.js";
import { fmtMs, machineNote, median, ratio, write } from "./common.js";

interface Req {
  group: string;
  state: unknown;
  questions: Record<string, unknown>;
}

export interface FamiliesOptions {
  codeRows: number;
  factRows: number;
  /** Items (claims) per request sent one by one for the naive baseline. */
  naiveSample: number;
}

export async function familiesScenario(opts: FamiliesOptions, command: string): Promise<void> {
  const engine = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_MODEL_SCHEDULE: "always" }));
  const run = async (model: string, r: Req) => {
    const t = performance.now();
    const res = await engine.run({ model, state: r.state, questions: r.questions } as RequestEnvelope, {
      requestId: "bench",
      orgId: "bench",
      timings: new Timings(),
    });
    const details = (res.details ?? {}) as Record<string, { escalated?: boolean }>;
    return {
      ms: performance.now() - t,
      tokens: res.usage.input_tokens,
      escalated: Object.values(details).filter((d) => d.escalated).length,
      items: Object.keys(res.answers).length,
    };
  };
  try {
    const data = path.join(ROOT, "..", "shared", "data");
    const code = codeSearchRequests(spreadRows(readCodeSearch(path.join(data, "code_search.jsonl")), opts.codeRows));
    const fact = factCheckRequests(spreadRows(readFactCheck(path.join(data, "factcheck_summedits.jsonl")), opts.factRows * 8)).slice(
      0,
      opts.factRows,
    );
    const rows: Record<string, number | string | null>[] = [];
    const measure = async (family: string, names: string[], reqs: Req[]) => {
      await run(names[0]!, reqs[0]!); // warm-up
      for (const name of names) {
        const per = [];
        for (const r of reqs) per.push(await run(name, r));
        rows.push({
          family,
          name,
          requests: per.length,
          "items/request": median(per.map((p) => p.items)),
          "p50 ms": median(per.map((p) => p.ms)),
          "tokens/request": median(per.map((p) => p.tokens)),
          "escalated share": per.reduce((s, p) => s + p.escalated, 0) / per.reduce((s, p) => s + p.items, 0),
        });
      }
      // Naive: the first `naiveSample` items of each request alone, scaled to the request.
      const naive = [];
      for (const r of reqs) {
        const ids = Object.keys(r.questions);
        const sample = ids.slice(0, Math.min(ids.length, opts.naiveSample));
        let ms = 0;
        for (const id of sample) {
          const q = family === "code search" ? { ...(r.state as object), items: (r.state as { items: { id: string }[] }).items.filter((it) => `q${it.id.slice(1)}` === id) } : r.state;
          ms += (await run(names[0]!, { group: r.group, state: q, questions: { [id]: r.questions[id] } })).ms;
        }
        naive.push((ms / sample.length) * ids.length);
      }
      const lite = rows.find((r) => r.name === names[0])!;
      rows.push({
        family,
        name: `naive (${names[0]}, one request per item)`,
        requests: naive.length,
        "items/request": lite["items/request"]!,
        "p50 ms": median(naive),
        "tokens/request": null,
        "escalated share": null,
      });
      lite["naive / assay"] = ratio(median(naive), lite["p50 ms"] as number);
    };
    await measure("code search", ["judge-codegrep-lite", "judge-codegrep", "judge-codegrep-max"], code);
    await measure("fact check", ["judge-factcheck-lite", "judge-factcheck", "judge-factcheck-max"], fact);
    const md =
      `# families (${new Date().toISOString()})\n\n\`${command}\`\n\n${JSON.stringify(machineNote())}\n\n` +
      "| family | name | requests | items/request | p50 ms | tokens/request | escalated share | naive / assay |\n|---|---|---:|---:|---:|---:|---:|---:|\n" +
      rows
        .map(
          (r) =>
            `| ${r.family} | ${r.name} | ${r.requests} | ${r["items/request"]} | ${fmtMs(r["p50 ms"] as number)} | ${r["tokens/request"] ?? "–"} | ${
              typeof r["escalated share"] === "number" ? (r["escalated share"] as number).toFixed(2) : "–"
            } | ${r["naive / assay"] ?? ""} |`,
        )
        .join("\n") +
      "\n";
    write("families", { command, rows }, md);
  } finally {
    await engine.close();
  }
}
