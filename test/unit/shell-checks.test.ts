/**
 * Shell checks that cannot pass or fail by timing. Under `set -o pipefail` a reader that stops early
 * (`grep -q`, `head`) kills its writer with SIGPIPE whenever the writer has more to say, and the
 * pipeline fails by chance: scripts/mesa-vulkan.sh's check did, 4 times in 300 on an idle machine.
 * Here a stub `ldconfig` always has more to say, so the race is lost every time, not sometimes.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "../..");
const MESA = path.join(ROOT, "scripts", "mesa-vulkan.sh");
const LIBVULKAN = "\tlibvulkan.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libvulkan.so.1";

let bin: string;
let calls: string;

/** A PATH whose `ldconfig -p` prints `first` and then 2 MiB of other libraries, and whose apt-get only records that it ran. */
function stubs(dir: string, first: string | null): void {
  fs.mkdirSync(dir, { recursive: true });
  const filler = "\tlibfiller.so.0 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libfiller.so.0";
  fs.writeFileSync(
    path.join(dir, "ldconfig"),
    `#!/usr/bin/env bash\necho "9999 libs found in cache"\n${first === null ? "" : `printf '%s\\n' '${first}'\n`}` +
      `yes '${filler}' | head -c 2097152\n`,
    { mode: 0o755 },
  );
  fs.writeFileSync(path.join(dir, "dpkg-query"), "#!/usr/bin/env bash\nprintf '25.0.7-2~bpo12+1'\n", { mode: 0o755 });
  for (const tool of ["apt-get", "apt"]) {
    fs.writeFileSync(path.join(dir, tool), `#!/usr/bin/env bash\necho "${tool} $*" >>'${calls}'\n`, { mode: 0o755 });
  }
}

function runWith(dir: string, argv: string[]) {
  return spawnSync("bash", argv, { encoding: "utf8", env: { ...process.env, PATH: `${dir}:${process.env.PATH}` } });
}

beforeAll(() => {
  bin = fs.mkdtempSync(path.join(os.tmpdir(), "assay-shell-"));
  calls = path.join(bin, "calls.log");
  stubs(path.join(bin, "present"), LIBVULKAN);
  stubs(path.join(bin, "absent"), null);
});
afterAll(() => fs.rmSync(bin, { recursive: true, force: true }));

describe("scripts/mesa-vulkan.sh against an ldconfig with 2 MiB after the match", () => {
  it("the old check (`ldconfig -p | grep -q` under pipefail) fails every time against the stub: the stub reproduces the race", () => {
    for (let i = 0; i < 5; i++) {
      const r = runWith(path.join(bin, "present"), ["-c", "set -o pipefail; ldconfig -p | grep -q 'libvulkan\\.so\\.1'"]);
      expect(r.status).not.toBe(0);
    }
  });

  it("the check passes every time, and installs nothing", () => {
    for (let i = 0; i < 20; i++) {
      for (const argv of [[MESA, "--check"], [MESA]]) {
        const r = runWith(path.join(bin, "present"), argv);
        expect(r.stderr).toBe("");
        expect(r.status).toBe(0);
      }
    }
    expect(fs.existsSync(calls)).toBe(false);
  });

  it("with the line absent, --check fails with its message and installs nothing", () => {
    const r = runWith(path.join(bin, "absent"), [MESA, "--check"]);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/\[mesa-vulkan\] no Mesa >= 25 Vulkan driver/);
    expect(fs.existsSync(calls)).toBe(false);
  });
});

/** Every tracked shell file: *.sh, .ci/run, and any file whose first line names bash or sh. */
function shellFiles(): string[] {
  const tracked = spawnSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" }).stdout.split("\0").filter(Boolean);
  return tracked.filter((f) => {
    if (f.endsWith(".sh") || f === ".ci/run") return true;
    const p = path.join(ROOT, f);
    if (!fs.existsSync(p) || !fs.statSync(p).isFile()) return false;
    const head = fs.readFileSync(p, "utf8").slice(0, 80);
    return /^#!\s*\S*(\/(ba)?sh|env (ba)?sh)\b/.test(head);
  });
}

/** Lines of a shell text that pipe into a reader that may stop before its writer has finished. */
export function earlyReaders(text: string): string[] {
  const early = /\|&?\s*(grep\b[^|;&]*\s(-[A-Za-z]*q[A-Za-z]*|--quiet|--silent)\b|head\b)/;
  return text
    .split("\n")
    .map((line, i) => ({ line, n: i + 1 }))
    .filter(({ line }) => !/^\s*#/.test(line) && early.test(line))
    .map(({ line, n }) => `${n}: ${line.trim()}`);
}

describe("shell lint", () => {
  it("finds the shell files (the three known ones at least)", () => {
    expect(shellFiles()).toEqual(expect.arrayContaining([".ci/run", "scripts/mesa-vulkan.sh", "bench/gpu-check.sh"]));
  });

  it("no shell file that sets pipefail pipes into grep -q, grep --quiet or head", () => {
    const found = shellFiles().flatMap((f) => {
      const text = fs.readFileSync(path.join(ROOT, f), "utf8");
      if (!/pipefail/.test(text)) return [];
      return earlyReaders(text).map((l) => `${f}:${l}`);
    });
    expect(found).toEqual([]);
  });

  it("the lint catches each form it names, and lets a full read through", () => {
    expect(earlyReaders("ldconfig -p | grep -q 'libvulkan'")).toHaveLength(1);
    expect(earlyReaders("ldconfig -p | grep -Fq x")).toHaveLength(1);
    expect(earlyReaders("ldconfig -p |grep --quiet x")).toHaveLength(1);
    expect(earlyReaders("dmesg |& head -n 3")).toHaveLength(1);
    expect(earlyReaders("ldconfig -p | grep x >/dev/null")).toEqual([]);
    expect(earlyReaders("# ldconfig -p | grep -q x")).toEqual([]);
  });

  it("no package registry's host is named in the project's files", () => {
    const r = spawnSync(
      "git",
      ["grep", "-nE", "deb\\.debian\\.org|pypi\\.org|pythonhosted\\.org|registry\\.npmjs\\.org|nuget\\.org", "--", ".", ":!package-lock.json", ":!test/unit/shell-checks.test.ts"],
      { cwd: ROOT, encoding: "utf8" },
    );
    expect(r.stdout).toBe("");
    expect(r.status).toBe(1);
  });
});
