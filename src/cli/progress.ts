import { Writable } from "node:stream";
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
