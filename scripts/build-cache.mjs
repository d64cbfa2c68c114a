// The per-user cache of model builds, shared by every checkout on the machine the way pip's and Hugging
// Face's caches are. An entry is named by a key over everything a build is made from: the recipe (its
// packages' and GGUF's hashes, its export arguments), the contents of every script that writes a graph,
// the converter's pinned versions and the Python that runs them, and the bootstrap's format constants.
// So a second checkout converts nothing, and a changed export script (a comment will do) makes a new
// entry instead of serving a stale one.
//
// Node built-ins only: bootstrap imports this before node_modules exists.
//
// Layout under the cache root (ASSAY_BUILD_CACHE; default $XDG_CACHE_HOME/assay, else ~/.cache/assay):
//   builds/<recipe>-<key>/   a build: manifest.json, its graphs, tokenizer; .assay-stages lists the steps done
//   weights/<recipe>-<sha>.gguf, downloads/<recipe>/   the assembled weights and the wheels they came from
//   pyenv/<key>/             the converter's venv, keyed by its requirements and the Python it was made with
//   cuda/                    the CUDA provider and runtime libraries from PyPI (scripts/cuda-provider.mjs)
//   lock/                    held by the bootstrap that is building (its pid inside)
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** Where the cache lives: ASSAY_BUILD_CACHE, else the XDG cache folder. */
export function cacheRoot(env = process.env) {
  if (env.ASSAY_BUILD_CACHE) return path.resolve(env.ASSAY_BUILD_CACHE);
  const xdg = env.XDG_CACHE_HOME && path.isAbsolute(env.XDG_CACHE_HOME) ? env.XDG_CACHE_HOME : path.join(os.homedir(), ".cache");
  return path.join(xdg, "assay");
}

/** The scripts whose contents go into a build; every graph of a build is written by one of these or what they import. */
export const BUILD_SCRIPTS = [
  "fetch_weights.py",
  "decoder.py",
  "export_onnx.py",
  "w8a8.py",
  "int8_graphs.py",
  "batch_graph.py",
  "gpu_graph.py",
];

/** JSON with keys sorted at every depth: the same recipe hashes the same whatever order its file lists keys in. */
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function digest(parts) {
  const h = crypto.createHash("sha256");
  for (const [name, value] of parts) h.update(`${name}\0${value}\0`);
  return h.digest("hex").slice(0, 16);
}

/**
 * The key of a recipe's build, and what went into it (written beside the build, so an entry says what made it).
 * `inputs`: { recipeName, recipe, scriptsDir, requirements (file path), python (its `--version` line), formats }.
 */
export function buildKey({ recipeName, recipe, scriptsDir, requirements, python, formats }) {
  const parts = [
    ["recipe", `${recipeName} ${canonical(recipe)}`],
    ...BUILD_SCRIPTS.map((f) => [`script ${f}`, crypto.createHash("sha256").update(fs.readFileSync(path.join(scriptsDir, f))).digest("hex")]),
    ["requirements", crypto.createHash("sha256").update(fs.readFileSync(requirements)).digest("hex")],
    ["python", python],
    ["formats", canonical(formats)],
    ["platform", `${process.platform}-${process.arch}`],
  ];
  return { key: digest(parts), inputs: Object.fromEntries(parts) };
}

/** The key of the converter's venv: its pinned requirements, the Python it is made from, the platform. */
export function venvKey({ requirements, python }) {
  return digest([
    ["requirements", crypto.createHash("sha256").update(fs.readFileSync(requirements)).digest("hex")],
    ["python", python],
    ["platform", `${process.platform}-${process.arch}`],
  ]);
}

// Which steps an entry has finished. A step killed half-way leaves files that look whole; only a step that
// exited 0 is recorded, so the next bootstrap runs it again instead of serving what it left.
const STAGES = ".assay-stages";

export function stagesDone(dir) {
  try {
    return new Set(JSON.parse(fs.readFileSync(path.join(dir, STAGES), "utf8")));
  } catch {
    return new Set();
  }
}

function writeStages(dir, done) {
  const tmp = path.join(dir, `${STAGES}.${process.pid}`);
  fs.writeFileSync(tmp, JSON.stringify([...done].sort()));
  fs.renameSync(tmp, path.join(dir, STAGES));
}

export function markStage(dir, stage) {
  const done = stagesDone(dir);
  done.add(stage);
  writeStages(dir, done);
}

export function unmarkStage(dir, stage) {
  const done = stagesDone(dir);
  if (done.delete(stage)) writeStages(dir, done);
}

/**
 * Points `link` at `target`, replacing whatever is at `link` (an older checkout's own build folder, a link to
 * an older entry). Relative links would break when a checkout moves; the cache does not move.
 */
export function pointAt(link, target) {
  let current = null;
  try {
    current = fs.readlinkSync(link);
  } catch {
    // not a link (missing, or a real folder of an older layout)
  }
  if (current === target) return false;
  fs.rmSync(link, { recursive: true, force: true });
  fs.mkdirSync(path.dirname(link), { recursive: true });
  const tmp = `${link}.link-${process.pid}`;
  fs.rmSync(tmp, { force: true });
  fs.symlinkSync(target, tmp);
  fs.renameSync(tmp, link);
  return true;
}

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e.code === "EPERM";
  }
};

/**
 * Holds the cache's lock while `fn` runs: two bootstraps (two checkouts, or CI beside a developer) never
 * write one entry at once. The lock is a folder (mkdir is atomic) with the holder's pid; a holder that died
 * leaves it, and the next one takes it over.
 */
export function withLock(root, say, fn) {
  const lock = path.join(root, "lock");
  fs.mkdirSync(root, { recursive: true });
  const wait = new Int32Array(new SharedArrayBuffer(4));
  let told = false;
  for (;;) {
    try {
      fs.mkdirSync(lock);
      fs.writeFileSync(path.join(lock, "pid"), String(process.pid));
      break;
    } catch (e) {
      if (e.code !== "EEXIST") throw e;
      let pid = NaN;
      try {
        pid = Number(fs.readFileSync(path.join(lock, "pid"), "utf8"));
      } catch {
        // the holder has made the folder and not yet written its pid
      }
      const age = (() => {
        try {
          return Date.now() - fs.statSync(lock).mtimeMs;
        } catch {
          return 0;
        }
      })();
      if ((Number.isInteger(pid) && pid > 0 && !alive(pid)) || (!Number.isInteger(pid) && age > 10_000)) {
        say(`taking over the build cache's lock from a bootstrap that is gone (pid ${Number.isNaN(pid) ? "?" : pid})`);
        fs.rmSync(lock, { recursive: true, force: true });
        continue;
      }
      if (!told) say(`waiting for another bootstrap (pid ${pid}) building into ${root} ...`);
      told = true;
      Atomics.wait(wait, 0, 0, 500);
    }
  }
  const release = () => fs.rmSync(lock, { recursive: true, force: true });
  let result;
  try {
    result = fn();
  } catch (e) {
    release();
    throw e;
  }
  // An async fn holds the lock until it settles.
  if (result instanceof Promise) return result.finally(release);
  release();
  return result;
}

/**
 * Removes what a bootstrap killed half-way left (a build's `.partial-<pid>` folder, a GGUF's `.partial`):
 * called with the lock held, when no one else can be writing one.
 */
export function sweepPartials(root) {
  for (const kind of ["builds", "weights"]) {
    const dir = path.join(root, kind);
    if (!fs.existsSync(dir)) continue;
    for (const e of fs.readdirSync(dir)) if (/\.partial(-\d+)?$/.test(e)) fs.rmSync(path.join(dir, e), { recursive: true, force: true });
  }
}

/** Each entry's size and when a bootstrap last used it (`node scripts/bootstrap.mjs --cache`). */
export function describeCache(root) {
  const sizeOf = (p) => {
    const st = fs.lstatSync(p);
    if (!st.isDirectory()) return st.size;
    return fs.readdirSync(p).reduce((s, e) => s + sizeOf(path.join(p, e)), 0);
  };
  const rows = [];
  for (const kind of ["builds", "weights", "downloads", "pyenv", "cuda"]) {
    const dir = path.join(root, kind);
    if (!fs.existsSync(dir)) continue;
    for (const e of fs.readdirSync(dir)) {
      const p = path.join(dir, e);
      const used = fs.existsSync(path.join(p, ".assay-used")) ? fs.statSync(path.join(p, ".assay-used")).mtime : fs.statSync(p).mtime;
      rows.push({ kind, name: e, bytes: sizeOf(p), used });
    }
  }
  return rows;
}

/** Records that a checkout used an entry now (its mtime), for pruning by age. */
export function touchUsed(dir) {
  const f = path.join(dir, ".assay-used");
  const now = new Date();
  try {
    fs.utimesSync(f, now, now);
  } catch {
    fs.writeFileSync(f, "");
  }
}
