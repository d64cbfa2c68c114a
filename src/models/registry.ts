import fs from "node:fs";
import path from "node:path";
import { z } from "zod";

/**
 * Public model names → model builds. The file is models/models.json by
 * default (ASSAY_MODELS_CONFIG): a deployment points a name at another
 * exported model folder (for example a larger model on a GPU server) by
 * editing it, without touching code.
 */
const Build = z.object({
  /** Folder with manifest.json + model.onnx; relative to ASSAY_MODELS_DIR or absolute. */
  dir: z.string(),
  /** Recipe in models/recipes.json that makes this folder (used by bootstrap). */
  recipe: z.string().optional(),
  /**
   * `always`: loaded at boot and kept. `scheduled`: kept loaded during
   * ASSAY_MODEL_SCHEDULE, unloaded when idle outside it, loaded on demand
   * (requests that need it meanwhile get 503 + Retry-After).
   */
  availability: z.enum(["always", "scheduled"]).default("always"),
});

const Entry = z.union([
  z.strictObject({ alias_of: z.string(), deprecated: z.boolean().default(false) }),
  z.strictObject({
    family: z.enum(["general", "factcheck", "codesearch"]),
    build: z.string(),
    /** A larger build that rescores the items this one is unsure about. */
    escalate_to: z.string().optional(),
    /** Reported as `effort` by the families that have one (code search). */
    effort: z.enum(["low", "medium", "high"]).optional(),
    deprecated: z.boolean().default(false),
  }),
]);

export const RegistryFile = z.object({
  builds: z.record(z.string(), Build),
  models: z.record(z.string(), Entry),
  default: z.string(),
});
export type RegistryFile = z.infer<typeof RegistryFile>;

export interface ResolvedModel {
  /** The name the caller sent (echoed in the response). */
  name: string;
  /** The concrete entry after following aliases. */
  target: string;
  family: "general" | "factcheck" | "codesearch";
  build: string;
  buildDir: string;
  escalateTo: string | null;
  effort: "low" | "medium" | "high" | null;
  deprecated: boolean;
  aliasOf: string | null;
}

export class ModelRegistry {
  constructor(
    readonly file: RegistryFile,
    private readonly modelsDir: string,
  ) {
    // Fail at boot, not on a request: every alias must end at a model.
    for (const name of Object.keys(file.models)) {
      const r = this.resolve(name);
      if (r.escalateTo) this.buildDir(r.escalateTo);
    }
    if (!this.has(file.default)) throw new Error(`models config: default "${file.default}" is not a model name`);
  }

  static load(configPath: string, modelsDir: string): ModelRegistry {
    const raw = JSON.parse(fs.readFileSync(configPath, "utf8")) as unknown;
    const parsed = RegistryFile.safeParse(raw);
    if (!parsed.success) throw new Error(`models config ${configPath}: ${parsed.error.message}`);
    return new ModelRegistry(parsed.data, modelsDir);
  }

  has(name: string): boolean {
    return Object.hasOwn(this.file.models, name);
  }

  names(): string[] {
    return Object.keys(this.file.models);
  }

  /** Every build some public name uses (directly or as its escalation target). */
  usedBuilds(): string[] {
    const out = new Set<string>();
    for (const name of this.names()) {
      const r = this.resolve(name);
      out.add(r.build);
      if (r.escalateTo) out.add(r.escalateTo);
    }
    return [...out];
  }

  availability(build: string): "always" | "scheduled" {
    const b = this.file.builds[build];
    if (!b) throw new Error(`models config: unknown build "${build}"`);
    return b.availability;
  }

  buildDir(build: string): string {
    const b = this.file.builds[build];
    if (!b) throw new Error(`models config: unknown build "${build}"`);
    return path.isAbsolute(b.dir) ? b.dir : path.join(this.modelsDir, b.dir);
  }

  /** Follows aliases; throws for unknown names or alias cycles. */
  resolve(name: string): ResolvedModel {
    const seen = new Set<string>();
    let cur = name;
    let deprecated = false;
    for (;;) {
      if (seen.has(cur)) throw new Error(`models config: alias cycle at "${cur}"`);
      seen.add(cur);
      const e = this.file.models[cur];
      if (!e) throw new Error(`unknown model "${cur}"`);
      if (cur === name) deprecated = e.deprecated;
      if ("alias_of" in e) {
        cur = e.alias_of;
        continue;
      }
      const direct = this.file.models[name]!;
      return {
        name,
        target: cur,
        family: e.family,
        build: e.build,
        buildDir: this.buildDir(e.build),
        escalateTo: e.escalate_to ?? null,
        effort: e.effort ?? null,
        deprecated,
        aliasOf: "alias_of" in direct ? direct.alias_of : null,
      };
    }
  }
}
