/**
 * The half-precision GPU graph (scripts/half_graph.py, model.gpu16.onnx) against the float32 GPU graph
 * (scripts/gpu_graph.py, model.gpu.onnx) it was made from, at the answers' level: each build's two
 * graphs served by the engine on the CPU provider (a build folder of links whose model.onnx is the
 * graph, as test/engine/webgpu.test.ts does), the README's request and `--dev` dev requests (rows
 * spread over BoolQ, AG News and SST-5, one question each), prefix cache and batching off.
 *
 * How the half graph runs on a CPU: onnxruntime's CPU provider has float16 MatMul kernels (float32
 * accumulation, the output rounded to float16, as a GPU's), so a float16 graph runs as written. It has
 * none for bfloat16: a bfloat16 graph runs as its float32 twin (`half_graph.py --twin`: the same half
 * values, each product computed in float32 and rounded to bfloat16), written to a temp folder.
 *
 * Per build: requests compared, answers chosen the same (noul on the same side of 0.5, choice and
 * score the same option), the largest |Δ| of noul and of an option's probability, and of score.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadConfig, ROOT } from "../src/config/index.js";
import { readDataset } from "../src/eval/datasets.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { Question, RequestEnvelope, SystemOneResponse } from "../src/validate/schema.js";
import { machineNote, write } from "./common.js";

export interface HalfPrecisionOptions {
  builds: string[];
  dev: number;
  /** The half graph's file in each build folder. */
  graph: string;
}

interface Req {
  id: string;
  state: string;
  questions: Record<string, Question>;
}

type Answers = SystemOneResponse["answers"];

const LINKED = ["manifest.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"];
const NAME = "judge";

/** The README's request, then `dev` single-question requests spread over three dev sets. */
function requests(dev: number): Req[] {
  const examples = JSON.parse(fs.readFileSync(path.join(ROOT, "docs", "examples.json"), "utf8")) as { name: string; request: Req }[];
  const readme = examples.find((e) => e.name === "refund")!.request;
  const out: Req[] = [{ id: "readme", state: readme.state, questions: readme.questions }];
  const data = path.join(ROOT, "..", "shared", "data");
  const files = ["noul_boolq.jsonl", "choice_agnews.jsonl", "score_sst5.jsonl"];
  files.forEach((f, i) => {
    const n = Math.floor(dev / files.length) + (i < dev % files.length ? 1 : 0);
    for (const it of readDataset(path.join(data, f), n).items) out.push({ id: it.id, state: it.state, questions: { q: it.question } });
  });
  return out;
}

/** A folder of links to `build`'s files whose model.onnx is `graph` (with its weights file beside it). */
function servedAs(dir: string, build: string, graph: string, name: string): string {
  const folder = path.join(dir, name);
  fs.mkdirSync(folder);
  for (const f of LINKED) if (fs.existsSync(path.join(build, f))) fs.symlinkSync(path.join(build, f), path.join(folder, f));
  fs.symlinkSync(graph, path.join(folder, "model.onnx"));
  const data = `${graph}.data`;
  if (fs.existsSync(data)) fs.symlinkSync(data, path.join(folder, path.basename(data)));
  return folder;
}

async function answersOf(dir: string, folder: string, reqs: Req[]): Promise<{ answers: Answers[]; seconds: number }> {
  const config = path.join(dir, `${path.basename(folder)}.models.json`);
  fs.writeFileSync(config, JSON.stringify({ default: NAME, builds: { b: { dir: folder } }, models: { [NAME]: { family: "general", build: "b" } } }));
  const engine = await EnginePipeline.create(
    loadConfig({
      ...process.env,
      LOG_LEVEL: "silent",
      ASSAY_MODELS_CONFIG: config,
      ASSAY_EXECUTION_PROVIDER: "cpu",
      ASSAY_PREFIX_CACHE_MB: "0",
      ASSAY_BATCH_MAX_TOKENS: "0",
      ASSAY_REQUEST_TIMEOUT_MS: "1800000",
      ASSAY_REQUEST_TIMEOUT_MAX_MS: "1800000",
    }),
  );
  try {
    const t = performance.now();
    const answers: Answers[] = [];
    for (const r of reqs) {
      const env: RequestEnvelope = { model: NAME, state: r.state, questions: r.questions };
      answers.push((await engine.run(env, { requestId: r.id, orgId: "bench", timings: new Timings() })).answers);
    }
    return { answers, seconds: (performance.now() - t) / 1000 };
  } finally {
    await engine.close();
  }
}

interface Distance {
  same: boolean;
  noul: number;
  probability: number;
  score: number;
}

function distance(a: Answers, b: Answers): Distance {
  const d: Distance = { same: true, noul: 0, probability: 0, score: 0 };
  for (const [id, x] of Object.entries(a)) {
    const y = b[id]!;
    if (x.type === "noul" && y.type === "noul") {
      d.noul = Math.max(d.noul, Math.abs(x.noul - y.noul));
      d.same &&= x.noul > 0.5 === y.noul > 0.5;
    }
    if (x.type === "choice" && y.type === "choice") d.same &&= x.choice === y.choice;
    if (x.type === "score" && y.type === "score") {
      d.score = Math.max(d.score, Math.abs(x.score - y.score));
      const top = (p: Record<string, number>) => Object.entries(p).reduce((m, e) => (e[1] > m[1] ? e : m))[0];
      d.same &&= top(x.probabilities) === top(y.probabilities);
    }
    if ("probabilities" in x && "probabilities" in y) {
      const py = y.probabilities as Record<string, number>;
      for (const [k, p] of Object.entries(x.probabilities)) d.probability = Math.max(d.probability, Math.abs(p - py[k]!));
    }
  }
  return d;
}

export async function halfPrecisionScenario(opts: HalfPrecisionOptions, command: string): Promise<void> {
  const machine = machineNote();
  const reqs = requests(opts.dev);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-half-precision-"));
  const rows: Record<string, string | number>[] = [];
  const detail: Record<string, unknown> = {};
  try {
    for (const b of opts.builds) {
      const build = path.resolve(ROOT, "models", "cache", b);
      const half = path.join(build, opts.graph);
      const factsFile = half.replace(/\.onnx$/, ".json");
      if (!fs.existsSync(half) || !fs.existsSync(factsFile)) throw new Error(`${half} is missing: python scripts/half_graph.py --build ${build}`);
      const facts = JSON.parse(fs.readFileSync(factsFile, "utf8")) as { dtype: string };
      let served = half;
      let method = "the CPU provider's float16 kernels";
      if (facts.dtype !== "float16") {
        // No bfloat16 MatMul on the CPU provider: the graph's float32 twin on the same half values.
        served = path.join(dir, `${b}-twin`, "model.onnx");
        const python = path.join(ROOT, ".cache", "pyenv", "bin", "python");
        const r = spawnSync(python, [path.join(ROOT, "scripts", "half_graph.py"), "--twin", served, "--graph", half], { stdio: "inherit" });
        if (r.status !== 0) throw new Error(`half_graph.py --twin failed (${String(r.status)})`);
        method = `its float32 twin (${facts.dtype} values, float32 arithmetic)`;
      }
      const ref = await answersOf(dir, servedAs(dir, build, path.join(build, "model.gpu.onnx"), `${b}-gpu`), reqs);
      const got = await answersOf(dir, servedAs(dir, build, served, `${b}-half`), reqs);
      const per = reqs.map((r, i) => ({ id: r.id, ...distance(ref.answers[i]!, got.answers[i]!) }));
      const readme = per[0]!;
      rows.push({
        build: b,
        dtype: facts.dtype,
        method,
        requests: per.length,
        same: `${per.filter((p) => p.same).length}/${per.length}`,
        noul: Math.max(...per.map((p) => p.noul)),
        probability: Math.max(...per.map((p) => p.probability)),
        score: Math.max(...per.map((p) => p.score)),
        readme: `noul ${readme.noul.toFixed(4)}, probability ${readme.probability.toFixed(4)}, score ${readme.score.toFixed(4)}, same ${String(readme.same)}`,
        float32_s: +ref.seconds.toFixed(1),
        half_s: +got.seconds.toFixed(1),
      });
      detail[b] = { per, float32: ref.answers, half: got.answers };
      console.log(`[half-precision] ${b}: ${JSON.stringify(rows.at(-1))}`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const f = (x: string | number) => (typeof x === "number" ? x.toFixed(4) : x);
  const md = [
    `## half-precision (${machine.startedAt})`,
    "",
    `\`${command}\`; the README's request and ${opts.dev} dev requests (BoolQ, AG News, SST-5), each build's ${opts.graph} against its model.gpu.onnx, both on the CPU provider; ` +
      `${machine.cpu}, ${machine.cores} cores, Node ${machine.node}`,
    "",
    "| build | dtype | run as | requests | chosen the same | max \\|Δ noul\\| | max \\|Δ probability\\| | max \\|Δ score\\| | README's request | float32 s | half s |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
    ...rows.map((r) => `| ${r.build} | ${r.dtype} | ${r.method} | ${r.requests} | ${r.same} | ${f(r.noul!)} | ${f(r.probability!)} | ${f(r.score!)} | ${r.readme} | ${r.float32_s} | ${r.half_s} |`),
  ].join("\n");
  write("half-precision", { machine, opts, rows, detail }, md);
}
