// Types for scripts/cuda-provider.mjs (a plain ES module of Node built-ins: the bootstrap and the launcher import it before TypeScript is installed).
type Env = Record<string, string | undefined>;
type Say = (message: string) => void;
export const ORT_VERSION: string;
export const SETS: string[];
export const PROVIDER_LIBRARIES: string[];
export const WHEELS: { name: string; version: string; set: string; sha256: string }[];
export function cudaDir(env?: Env): string;
export function libraryPath(env?: Env): string[];
export function withLibraryPath(env?: Env): Env & { LD_LIBRARY_PATH: string };
export function ortLibDir(root?: string): string;
export function setsFor(options: { run: boolean; env?: Env }): string[];
export function ensureCudaLibraries(options: { sets: string[]; say: Say; python?: string; env?: Env }): string;
export function linkProvider(options: { lib: string; ortDir?: string; say: Say }): "pypi" | "nuget";
export function ensureDebianDriver(options: { say: Say; env?: Env }): string;
export function ensureCudaProvider(options: { run: boolean; say: Say; python?: string; env?: Env }): { lib: string; route: "pypi" | "nuget" };
