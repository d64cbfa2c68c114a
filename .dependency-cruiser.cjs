/**
 * The import rules of src/README.md and the folder READMEs, checked
 * (`npx depcruise src`, and test/unit/import-rules.test.ts in `npm test`).
 * Each rule names a folder and the only folders of src/ it may import
 * (type-only imports count: they couple the folders all the same).
 */
const only = (name, folder, allowed, comment) => ({
  name,
  comment,
  severity: "error",
  from: { path: `^src/${folder}/` },
  to: { path: "^src/", pathNot: [`^src/${folder}/`, ...allowed.map((a) => `^src/${a}`)] },
});

const ENGINE = "(prompt|tokenizer|inference|probability|models)/";
/** The pool's parts (src/inference/README.md), and what only the pool may reach of the folder. */
const ROOMS = "queue|admission|batch-forming|express|lanes";
const inInference = (names) => `^src/inference/(${names})\\.ts$`;

module.exports = {
  forbidden: [
    only("observability-imports-nothing", "observability", [], "every folder may import observability/ without a cycle"),
    only("validate-imports-nothing", "validate", ["errors/"], "validation is the contract: it knows nothing of the service"),
    only("prompt-imports-validate", "prompt", ["validate/", "errors/"], "prompts are built from validated questions only"),
    only("tokenizer-imports-models-validate", "tokenizer", ["models/", "validate/", "errors/"]),
    only("probability-imports-models-validate", "probability", ["models/", "validate/", "errors/", "config/"]),
    only("inference-imports-config-errors-observability", "inference", ["config/", "errors/", "observability/"], "the pool knows passes, not requests"),
    only("models-imports-config-errors", "models", ["config/", "errors/", "observability/"], "the lifecycle takes a loader interface, not the pool"),
    only("engine-imports-the-layers-below", "engine", ["inference/", "prompt/", "tokenizer/", "models/", "validate/", "errors/", "observability/"], "the one seam into the pool: it knows builds and passes, not families or requests"),
    {
      name: "families-never-inference",
      comment: "a family turns a request into a prefix and branches; only engine/ packs, plans, admits and reads the pool",
      severity: "error",
      from: { path: "^src/families/" },
      to: { path: "^src/inference/" },
    },
    {
      name: "http-never-the-engine",
      comment: "all model work goes through the Pipeline interface",
      severity: "error",
      from: { path: "^src/http/" },
      to: { path: `^src/${ENGINE}` },
    },
    {
      name: "accounts-never-http-pipeline-engine",
      comment: "the model's family reaches Admission as a function",
      severity: "error",
      from: { path: "^src/accounts/" },
      to: { path: [`^src/${ENGINE}`, "^src/(http|pipeline|families|batch|cli)/", "^node_modules/fastify/"] },
    },
    {
      name: "accounts-imported-by-the-edge-only",
      comment:
        "only the HTTP edge, the process entry points, the admin CLI and batch pricing hold accounts; " +
        "money.ts is pure µUSD arithmetic (no store, no I/O), the one USD parser, so config may use it too",
      severity: "error",
      from: { path: "^src/", pathNot: ["^src/(accounts|http|cli|batch)/", "^src/(app|main)\\.ts$"] },
      to: { path: "^src/accounts/", pathNot: "^src/accounts/money\\.ts$" },
    },
    {
      name: "families-pipeline-never-http-accounts",
      severity: "error",
      from: { path: "^src/(families|pipeline)/" },
      to: { path: "^src/(http|accounts)/" },
    },
    {
      name: "served-code-never-offline-tools",
      comment: "the server applies a calibration file and never fits one: eval/ (fitting, dev runs) and cli/ are offline tools",
      severity: "error",
      from: { path: ["^src/(http|validate|accounts|pipeline|families|engine|prompt|tokenizer|inference|probability|models|config|errors|observability|batch)/", "^src/(app|main)\\.ts$"] },
      to: { path: "^src/(eval|cli)/" },
    },
    {
      name: "inference-rooms-apart",
      comment:
        "src/inference/README.md: the queue, admission, batch forming, the express path and the lanes never import one another " +
        "(so the first four never reach the workers), nor the pool that composes them: each gets what it needs of the others " +
        "through the host interface pool.ts hands it",
      severity: "error",
      from: { path: inInference(ROOMS) },
      to: { path: inInference(`${ROOMS}|pool|test-hooks`) },
    },
    {
      name: "inference-records-and-policy-below-the-rooms",
      comment: "the shared records (jobs.ts), the policies (work.ts, cost.ts, fair-queue.ts) and the worker side import none of the rooms",
      severity: "error",
      from: { path: "^src/inference/", pathNot: inInference(`${ROOMS}|pool`) },
      to: { path: inInference(`${ROOMS}|pool|test-hooks`) },
    },
    {
      name: "inference-test-hooks-via-the-pool",
      comment: "test hooks are off the pool's surface: only the pool attaches them and only the process entry (POST /__test/faults) reaches them",
      severity: "error",
      from: { path: "^src/", pathNot: ["^src/inference/pool\\.ts$", "^src/main\\.ts$"] },
      to: { path: "^src/inference/test-hooks\\.ts$" },
    },
    {
      name: "inference-surface-is-the-pool",
      comment: "outside src/inference only the pool and the pure modules (pack, cost, work, protocol) are imported, never a room or the records",
      severity: "error",
      from: { path: "^src/", pathNot: "^src/inference/" },
      to: { path: inInference(`${ROOMS}|jobs|fair-queue`) },
    },
    {
      name: "engine-planner-never-runs",
      comment: "src/engine/README.md: the pass planner (planner.ts) and its arithmetic (passes.ts) plan passes; only index.ts runs them on the pool",
      severity: "error",
      from: { path: "^src/engine/(planner|passes)\\.ts$" },
      to: { path: ["^src/inference/pool\\.ts$", "^src/engine/index\\.ts$"] },
    },
    {
      name: "engine-passes-pure",
      comment: "passes.ts is the planner's arithmetic: never the planner, the prior cache or the engine that use it",
      severity: "error",
      from: { path: "^src/engine/passes\\.ts$" },
      to: { path: "^src/engine/(planner|prior|index)\\.ts$" },
    },
    {
      name: "no-circular",
      severity: "error",
      from: {},
      to: { circular: true, dependencyTypesNot: ["type-only"] },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { exportsFields: ["exports"], conditionNames: ["import", "require", "node", "default"], extensions: [".ts", ".js"] },
  },
};
