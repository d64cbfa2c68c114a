/**
 * The `assay` command line (bin/assay.js → dist/src/cli/index.js).
 * Subcommands register themselves here; each takes its output streams and
 * environment from `CliIO`, so tests run them in-process.
 */
import { Command, CommanderError } from "commander";
import { registerKeyCommands, type CliIO } from "./keys.js";
import { registerEvalCommand } from "./eval.js";
import { registerCalibrateCommand } from "./calibrate.js";
import { registerBatchCommand } from "./batch.js";
import { registerCreditCommands } from "./credit.js";
import { registerStudyCommand } from "./study.js";
import { registerBuildCommand } from "./build.js";

export type { CliIO } from "./keys.js";

const defaultIO = (): CliIO => ({
  stdout: (t) => process.stdout.write(t),
  stderr: (t) => process.stderr.write(t),
  env: process.env,
});

export function buildCli(io: CliIO = defaultIO()): Command {
  const program = new Command("assay")
    .description("local inference server for the typed-question API")
    .exitOverride()
    .configureOutput({ writeOut: io.stdout, writeErr: io.stderr });
  registerKeyCommands(program, io);
  registerCreditCommands(program, io);
  registerEvalCommand(program, io);
  registerCalibrateCommand(program, io);
  registerBatchCommand(program, io);
  registerStudyCommand(program, io);
  registerBuildCommand(program, io);
  return program;
}

/** Run with node-style argv (`[node, script, ...args]`); resolves to the exit code. */
export async function runCli(argv: readonly string[] = process.argv, io: Partial<CliIO> = {}): Promise<number> {
  const full: CliIO = { ...defaultIO(), ...io };
  const program = buildCli(full);
  try {
    await program.parseAsync([...argv], { from: "node" });
    return 0;
  } catch (e) {
    // Commander has already printed usage errors and help.
    if (e instanceof CommanderError) return e.exitCode;
    full.stderr(`assay: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}
