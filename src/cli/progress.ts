import { Writable } from "node:stream";
import cliProgress from "cli-progress";
import type { Progress } from "../eval/runner.js";
import type { CliIO } from "./keys.js";

/**
 * A stream for cli-progress that writes to the CLI's stderr. It claims the
 * real stderr's TTY-ness and width, so bars redraw in a terminal and print a
 * line every few seconds in a log.
 */
export function stderrStream(io: CliIO): NodeJS.WritableStream {
  return Object.assign(
    new Writable({
      write(chunk: Buffer | string, _enc, cb) {
        io.stderr(chunk.toString());
        cb();
      },
    }),
    { isTTY: process.stderr.isTTY === true, columns: process.stderr.columns },
  );
}

/** cli-progress bar drawing on the CLI's stderr (TTY behaviour follows the real stderr). */
export function progressBar(io: CliIO, label: string): Progress {
  const stream = stderrStream(io);
  const bar = new cliProgress.SingleBar(
    {
      stream,
      format: `${label} |{bar}| {value}/{total} requests | {dataset} | {duration_formatted} elapsed, ETA {eta_formatted}`,
      hideCursor: true,
      noTTYOutput: true,
      notTTYSchedule: 10_000,
      etaBuffer: 20,
    },
    cliProgress.Presets.shades_classic,
  );
  return {
    start: (total) => bar.start(total, 0, { dataset: "" }),
    tick: (dataset) => bar.increment(1, { dataset }),
    addToTotal: (n) => bar.setTotal(bar.getTotal() + n),
    stop: () => bar.stop(),
  };
}
