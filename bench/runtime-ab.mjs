#!/usr/bin/env node
/**
 * One bench command in two checkouts, alternately, in one sitting: the way to compare two
 * runtimes (or two dependency sets) on the same code, models and machine. Each run is
 * `node dist/bench/cli.js <command…>` with cwd = that checkout, so each side loads its own
 * node_modules; the scenario's JSON is the newest `<tree>/bench/out/<scenario>-*.json` written
 * during the run. Prints (and with --out appends) a Markdown table: every figure per run, the
 * median per side, and old / new both as the median of the per-round ratios (each round runs
 * both sides back to back, so a drift in the machine's speed weighs on the pair alike) and as
 * the ratio of the medians.
 *
 *   node bench/runtime-ab.mjs --old /tmp/ort-old --new /tmp/ort-new [--rounds 2] [--out file.md] [--json file.json] \
 *     -- latency --model judge-latest --layers engine --baselines llama --requests 6 --warmup 1 --cells primary
 *
 * Both checkouts need a built dist/ (`npx tsc -p tsconfig.json`) and the same models
 * (models/cache may be a link to one folder). Node built-ins only: it runs before and
 * after any dependency change.
 */
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

function parseArgs(argv) {
  const sep = argv.indexOf("--");
  if (sep < 0) throw new Error("usage: runtime-ab.mjs --old DIR --new DIR [--rounds N] [--out FILE] [--json FILE] -- <bench command>");
  const o = { rounds: 2, bench: argv.slice(sep + 1) };
  const own = argv.slice(0, sep);
  for (let i = 0; i < own.length; i += 2) {
    const k = own[i].replace(/^--/, "");
    const v = own[i + 1];
    if (v === undefined) throw new Error(`${own[i]} needs a value`);
    o[k] = k === "rounds" ? Number(v) : v;
  }
  if (!o.old || !o.new) throw new Error("--old and --new are required");
  if (!Number.isInteger(o.rounds) || o.rounds < 1) throw new Error("--rounds must be an integer ≥ 1");
  if (o.bench.length === 0) throw new Error("no bench command after --");
  return o;
}

/** What a reader needs to reproduce a side: its commit, dirty or not, and the runtime it loads. */
function describeTree(dir) {
  const git = (...a) => {
    try {
      return execFileSync("git", ["-C", dir, ...a], { encoding: "utf8" }).trim();
    } catch {
      return "?";
    }
  };
  const pkg = (name) => {
    try {
      return JSON.parse(fs.readFileSync(path.join(dir, "node_modules", name, "package.json"), "utf8")).version;
    } catch {
      return "?";
    }
  };
  return {
    dir,
    commit: git("rev-parse", "--short", "HEAD"),
    dirty: git("status", "--porcelain", "--untracked-files=no") !== "",
    onnxruntime_node: pkg("onnxruntime-node"),
    onnxruntime_common: pkg("onnxruntime-common"),
  };
}

function machine() {
  let flags = "";
  try {
    const line = fs.readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => l.startsWith("flags"));
    flags = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8"].filter((f) => line?.split(/\s+/).includes(f)).join(" ");
  } catch {
    // not Linux: the CPU model alone
  }
  return { cpu: os.cpus()[0]?.model ?? "?", cores: os.availableParallelism(), mem_gb: Math.round(os.totalmem() / 2 ** 30), flags, node: process.version };
}

/** Runs the bench in `dir`; resolves to the path of the JSON the scenario wrote. */
function runOnce(dir, bench, log) {
  const scenario = bench[0];
  const outDir = path.join(dir, "bench", "out");
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["dist/bench/cli.js", ...bench], { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
    const tail = [];
    const keep = (chunk) => {
      const s = chunk.toString();
      log.write(s);
      tail.push(s);
      if (tail.length > 40) tail.shift();
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    child.on("error", reject);
    child.on("close", (code) => {
      const wallS = (Date.now() - started) / 1000;
      if (code !== 0) return reject(new Error(`${scenario} in ${dir} exited ${code}:\n${tail.join("").slice(-2000)}`));
      const files = fs.existsSync(outDir)
        ? fs
            .readdirSync(outDir)
            .filter((f) => f.startsWith(`${scenario}-`) && f.endsWith(".json"))
            .map((f) => ({ f: path.join(outDir, f), t: fs.statSync(path.join(outDir, f)).mtimeMs }))
            .filter((x) => x.t >= started - 1000)
            .sort((a, b) => b.t - a.t)
        : [];
      if (files.length === 0) return reject(new Error(`${scenario} in ${dir} wrote no ${scenario}-*.json under bench/out/`));
      resolve({ file: files[0].f, wallS });
    });
  });
}

const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/**
 * The figures each scenario's JSON gives, by name. Times in ms; a ratio says which way it is
 * taken. Unknown scenarios fall back to every top-level number.
 */
const FIGURES = {
  latency(r) {
    const out = {};
    for (const c of r.burst ?? []) {
      const p = c.llama?.paired;
      out[`${c.cell} assay engine p50 ms`] = num(c.layers?.engine?.p50);
      if (p) {
        out[`${c.cell} assay, paired with llama.cpp, p50 ms`] = num(p.assay?.p50);
        out[`${c.cell} llama.cpp p50 ms`] = num(p.llama?.p50);
        out[`${c.cell} assay / llama.cpp (p50s)`] = num(p.assay?.p50) && num(p.llama?.p50) ? +(p.assay.p50 / p.llama.p50).toFixed(3) : null;
        out[`${c.cell} assay / llama.cpp (median per pair)`] = num(p.median_of_pair_ratios) ? +(1 / p.median_of_pair_ratios).toFixed(3) : null;
        out[`${c.cell} same token ids`] = p.same_tokens ? 1 : 0;
      } else if (c.llama) {
        out[`${c.cell} llama.cpp best ms`] = num(c.llama.per_question?.request_ms_est);
        out[`${c.cell} llama.cpp best / assay`] = num(c.llama.llama_best_over_engine);
      }
    }
    out["llama-bench pp512 tok/s"] = num(r.llama_bench_pp512_tok_s);
    return out;
  },
  codesearch(r) {
    const out = {};
    for (const t of r.table ?? []) {
      out[`${t.name} ms / request`] = num(Number(t.s_per_request) * 1000);
      out[`${t.name} tokens / request`] = num(t.tokens_per_request);
      out[`${t.name} recall at noul > 0.5`] = num(Number(t.recall));
      out[`${t.name} kept at noul > 0.5`] = num(Number(t.kept));
      out[`${t.name} AUROC within a request`] = num(Number(t.auroc_within));
    }
    return out;
  },
  prefix(r) {
    const out = {};
    for (const layer of ["engine", "http"]) {
      const s = r.second_request?.[layer];
      if (!s) continue;
      out[`${layer}: first request ms`] = num(s.first_p50);
      out[`${layer}: second request (cache hit) ms`] = num(s.second_p50);
      out[`${layer}: first / second`] = num(s.first_over_second);
    }
    if (r.cold) {
      out["cold: no cache ms"] = num(r.cold.off_p50);
      out["cold: miss / no cache"] = num(r.cold.cold_over_off);
    }
    return out;
  },
  "long-state"(r) {
    const out = {};
    for (const row of r.rows ?? []) {
      out[`${row.state_tokens} tokens: one pass ms`] = num(row.one_pass_ms);
      out[`${row.state_tokens} tokens: chunked ms`] = num(row.chunked_ms);
      out[`${row.state_tokens} tokens: one pass / chunked`] = num(row.one_over_chunked);
      out[`${row.state_tokens} tokens: max abs Δ log-prob (one pass vs chunked)`] = num(row.max_abs_dlp);
    }
    return out;
  },
};

function figuresOf(scenario, json) {
  const f = FIGURES[scenario];
  if (f) return f(json);
  return Object.fromEntries(Object.entries(json).filter(([, v]) => typeof v === "number"));
}

function median(xs) {
  const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
  if (s.length === 0) return null;
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 100 ? Math.round(v).toLocaleString("en-US") : +v.toPrecision(4));

function table(o, sides, rounds) {
  const names = [...new Set(rounds.flatMap((r) => [...Object.keys(r.old), ...Object.keys(r.new)]))];
  const head = ["figure", ...rounds.flatMap((_, i) => [`old ${i + 1}`, `new ${i + 1}`]), "old median", "new median", "old / new (median per round)", "old / new (medians)"];
  const L = [`| ${head.join(" | ")} |`, `|${head.map((_, i) => (i === 0 ? "---" : "---:")).join("|")}|`];
  for (const n of names) {
    const olds = rounds.map((r) => num(r.old[n]) ?? null);
    const news = rounds.map((r) => num(r.new[n]) ?? null);
    const pair = median(olds.map((x, i) => (x !== null && news[i] ? x / news[i] : null)));
    const mo = median(olds);
    const mn = median(news);
    L.push(`| ${n} | ${rounds.flatMap((_, i) => [fmt(olds[i]), fmt(news[i])]).join(" | ")} | ${fmt(mo)} | ${fmt(mn)} | ${pair === null ? "–" : pair.toFixed(3)} | ${mo !== null && mn ? (mo / mn).toFixed(3) : "–"} |`);
  }
  return [
    `### \`${o.bench.join(" ")}\``,
    "",
    `old: \`${sides.old.dir}\` (${sides.old.commit}${sides.old.dirty ? ", dirty" : ""}, onnxruntime-node ${sides.old.onnxruntime_node}); ` +
      `new: \`${sides.new.dir}\` (${sides.new.commit}${sides.new.dirty ? ", dirty" : ""}, onnxruntime-node ${sides.new.onnxruntime_node}); ` +
      `${o.rounds} round(s), old then new in each; wall s per run: ${rounds.map((r) => `${Math.round(r.wall.old)} / ${Math.round(r.wall.new)}`).join(", ")}; ` +
      `load ${rounds.map((r) => r.load.join("→")).join(", ")}.`,
    "",
    ...L,
    "",
  ].join("\n");
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const scenario = o.bench[0];
  const sides = { old: describeTree(path.resolve(o.old)), new: describeTree(path.resolve(o.new)) };
  const logFile = path.join(os.tmpdir(), `runtime-ab-${scenario}-${Date.now()}.log`);
  const log = fs.createWriteStream(logFile);
  const m = machine();
  const started = new Date().toISOString();
  console.error(`runtime-ab: ${scenario}, ${o.rounds} round(s); bench output in ${logFile}`);
  const rounds = [];
  for (let i = 0; i < o.rounds; i++) {
    const r = { old: {}, new: {}, files: {}, wall: {}, load: [+os.loadavg()[0].toFixed(2)] };
    for (const side of ["old", "new"]) {
      log.write(`\n===== round ${i + 1} ${side} (${sides[side].dir}) ${new Date().toISOString()}\n`);
      const { file, wallS } = await runOnce(sides[side].dir, o.bench, log);
      r.files[side] = file;
      r.wall[side] = wallS;
      r[side] = figuresOf(scenario, JSON.parse(fs.readFileSync(file, "utf8")));
      console.error(`  round ${i + 1} ${side}: ${Math.round(wallS)} s → ${file}`);
    }
    r.load.push(+os.loadavg()[0].toFixed(2));
    rounds.push(r);
  }
  log.end();
  const md = [
    `## runtime A/B: ${scenario} (${started})`,
    "",
    `Machine: ${m.cpu}, ${m.cores} cores, ${m.mem_gb} GB, ${m.flags || "flags unknown"}; Node ${m.node}.`,
    "",
    table(o, sides, rounds),
  ].join("\n");
  console.log(md);
  if (o.out) fs.appendFileSync(o.out, md + "\n");
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ started, machine: m, sides, bench: o.bench, rounds }, null, 2));
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : e);
  process.exit(1);
});
