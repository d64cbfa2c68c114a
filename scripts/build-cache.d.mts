// Types for scripts/build-cache.mjs (a plain ES module of Node built-ins: the bootstrap runs before TypeScript is installed).
export interface BuildKeyInputs {
  recipeName: string;
  recipe: unknown;
  scriptsDir: string;
  requirements: string;
  python: string;
  formats: Record<string, unknown>;
}
export interface CacheRow {
  kind: "builds" | "weights" | "downloads" | "pyenv" | "cuda";
  name: string;
  bytes: number;
  used: Date;
}
export const BUILD_SCRIPTS: string[];
export function cacheRoot(env?: Record<string, string | undefined>): string;
export function buildKey(inputs: BuildKeyInputs): { key: string; inputs: Record<string, string> };
export function venvKey(inputs: { requirements: string; python: string }): string;
export function stagesDone(dir: string): Set<string>;
export function markStage(dir: string, stage: string): void;
export function unmarkStage(dir: string, stage: string): void;
export function pointAt(link: string, target: string): boolean;
export function withLock<T>(root: string, say: (message: string) => void, fn: () => T): T;
export function sweepPartials(root: string): void;
export function describeCache(root: string): CacheRow[];
export function touchUsed(dir: string): void;
