/**
 * The real server as its own process (`node dist/src/main.js`, what
 * `npm start` runs), for the shutdown and replica tests: reads its JSON log
 * from stdout, finds the port it listens on (PORT=0), and reports its exit.
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { ROOT } from "../../src/config/index.js";

export interface ServerProcess {
  proc: ChildProcess;
  url: string;
  /** Parsed JSON log lines so far, in order. */
  log: Record<string, unknown>[];
  /** Everything the process wrote, for failure messages. */
  output(): string;
  /** Resolves with the first log line whose msg matches. */
  waitForLog(msg: RegExp, ms?: number): Promise<Record<string, unknown>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): void;
}

/**
 * `launcher`: started as `npm start` starts it, through scripts/node.mjs (which sets what must be set
 * before Node starts: the CUDA libraries' path), in a process group of its own so that kill reaches the server.
 */
export async function startServer(env: Record<string, string>, { launcher = false } = {}): Promise<ServerProcess> {
  const main = path.join(ROOT, "dist", "src", "main.js");
  const proc = spawn(process.execPath, launcher ? [path.join(ROOT, "scripts", "node.mjs"), `node ${main}`] : [main], {
    cwd: ROOT,
    env: { ...process.env, HOST: "127.0.0.1", PORT: "0", LOG_LEVEL: "info", ...env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: launcher,
  });
  const log: Record<string, unknown>[] = [];
  let raw = "";
  let pending = "";
  const waiters: { re: RegExp; resolve: (l: Record<string, unknown>) => void }[] = [];
  proc.stdout!.on("data", (chunk: Buffer) => {
    raw += chunk.toString();
    pending += chunk.toString();
    let nl: number;
    while ((nl = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      if (!line.startsWith("{")) continue;
      const parsed = JSON.parse(line) as Record<string, unknown>;
      log.push(parsed);
      for (const w of waiters.filter((w) => w.re.test(String(parsed.msg)))) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(parsed);
      }
    }
  });
  proc.stderr!.on("data", (chunk: Buffer) => (raw += chunk.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const waitForLog = (re: RegExp, ms = 180_000) => {
    const seen = log.find((l) => re.test(String(l.msg)));
    if (seen) return Promise.resolve(seen);
    return new Promise<Record<string, unknown>>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no log line ${re} within ${ms} ms:\n${raw.slice(-3000)}`)), ms);
      waiters.push({ re, resolve: (l) => (clearTimeout(timer), resolve(l)) });
      void exited.then(({ code }) => reject(new Error(`server exited (${code}) before ${re}:\n${raw.slice(-3000)}`)));
    });
  };
  // A server that never says it listens is killed, not left running past the test.
  const listening = await waitForLog(/^assay listening/, 60_000).catch((e: unknown) => {
    proc.kill("SIGKILL");
    throw e;
  });
  return {
    proc,
    url: `http://127.0.0.1:${String(listening.port)}`,
    log,
    output: () => raw,
    waitForLog,
    exited,
    kill: (signal = "SIGTERM") => (launcher ? process.kill(-proc.pid!, signal) : proc.kill(signal)),
  };
}

/** After a test: its server killed and waited for, if it still runs, and its data folder removed. */
export async function stopServer(server: ServerProcess | null, dataDir: string): Promise<void> {
  if (server && server.proc.exitCode === null) {
    server.kill("SIGKILL");
    await server.exited;
  }
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
}
