#!/usr/bin/env node
// The first burst after readiness, measured from outside: boots the server of each tree given
// (`node <tree>/dist/src/main.js`, the models of this checkout), and right after it logs "default model
// ready" sends eight small one-question requests at once, then one alone, then eight more at once.
// Trees alternate over the rounds (the machine is noisy); one JSON line per boot.
//   node bench/ready-burst.mjs [--model judge-latest] [--rounds 2] [TREE ...]    (default: this checkout)
//   node bench/ready-burst.mjs . /tmp/old                                        a baseline's tree beside it
// Node built-ins only; each tree needs its dist/ (npm run build) and node_modules.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { values: o, positionals } = parseArgs({ options: { model: { type: "string", default: "judge-latest" }, rounds: { type: "string", default: "1" } }, allowPositionals: true });
const trees = (positionals.length ? positionals : [ROOT]).map((t) => path.resolve(t));

async function boot(tree) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-ready-burst-"));
  const t0 = performance.now();
  const proc = spawn(process.execPath, [path.join(tree, "dist", "src", "main.js")], {
    cwd: tree,
    env: { ...process.env, PORT: "0", ASSAY_DATA_DIR: dir, ASSAY_MODELS_DIR: process.env.ASSAY_MODELS_DIR ?? path.join(ROOT, "models", "cache"), ASSAY_CONCURRENCY_BEFORE_PURCHASE: "100" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let port = 0;
  let startup = 0;
  await new Promise((resolve, reject) => {
    let buf = "";
    proc.once("exit", (code) => reject(new Error(`server exited (${code}) before it was ready`)));
    proc.stdout.on("data", (chunk) => {
      buf += chunk;
      for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (!line.startsWith("{")) continue;
        const j = JSON.parse(line);
        if (j.port) port = j.port;
        if (/default model ready/.test(j.msg)) {
          startup = j.startupSeconds;
          resolve();
        }
      }
    });
  });
  const readyS = (performance.now() - t0) / 1000;
  const key = fs.readFileSync(path.join(dir, "local-api-key"), "utf8").trim();
  const ask = async (state) => {
    const r = await fetch(`http://127.0.0.1:${port}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: o.model, state, questions: { topic: { type: "choice", instructions: "What is it about?", criteria: { delivery: null, billing: null, product: null } } } }),
    });
    if (r.status !== 200) throw new Error(`${r.status} ${await r.text()}`);
    return r.json();
  };
  const time = async (states) => {
    const s = performance.now();
    await Promise.all(states.map(ask));
    return Math.round(performance.now() - s);
  };
  const burst = (tag) => Array.from({ length: 8 }, (_, i) => `${tag} message ${i}: the parcel is late again, and nobody answers the phone.`);
  const first = await time(burst("First"));
  const one = await time(["Alone: my invoice shows a charge I do not recognise."]);
  const second = await time(burst("Second"));
  proc.removeAllListeners("exit");
  proc.kill("SIGTERM");
  await new Promise((r) => proc.once("exit", r));
  fs.rmSync(dir, { recursive: true, force: true });
  return { tree, model: o.model, ready_s: Math.round(readyS * 10) / 10, startup_s: startup, first_burst_ms: first, one_ms: one, second_burst_ms: second, first_over_one: +(first / one).toFixed(2), first_over_second: +(first / second).toFixed(2) };
}

for (let r = 0; r < Number(o.rounds); r++) for (const tree of trees) console.log(JSON.stringify(await boot(tree)));
