import { defineConfig } from "vitest/config";

/**
 * Three tiers, run in this order by `npm test` (package.json), each its own
 * vitest run so a failure in a cheap tier stops before the model is built:
 *   fast     pure logic and the HTTP contract on the named fake pipeline: no
 *            model, no database server, files in parallel (`npm run test:fast`);
 *   engine   the real exported models (and the account stores), one file at a time;
 *   process  whole servers and child processes: operations, reliability.
 * File parallelism is a whole-run setting (not a project's): the fast tier's
 * scripts turn it on with --fileParallelism. A plain `vitest run` runs all
 * three tiers, one file at a time.
 */
const FAST = ["test/unit/**/*.test.ts", "test/http/**/*.test.ts"];
const PROCESS = ["test/ops/**/*.test.ts", "test/reliability/**/*.test.ts"];

export default defineConfig({
  test: {
    // Engine tests run the real model on 2 cores: one file at a time keeps
    // them from fighting over the cores and memory.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 180_000,
    reporters: ["default"],
    projects: [
      { extends: true, test: { name: "fast", include: FAST } },
      { extends: true, test: { name: "engine", include: ["test/**/*.test.ts"], exclude: [...FAST, ...PROCESS] } },
      { extends: true, test: { name: "process", include: PROCESS } },
    ],
  },
});
