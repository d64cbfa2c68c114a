/**
 * The structured log: pino JSON lines, one logger per process. Secrets never
 * reach it: the redaction paths below cover every place a credential header
 * could be logged (fastify's request serializer, our own request line, error
 * objects that carry headers), and API keys are never put in log fields.
 */
import { pino, type BaseLogger, type DestinationStream, type Logger, type LoggerOptions } from "pino";

/** Header names that carry a credential; `api_key` is what the Stainless-generated client sends. */
export const SECRET_HEADERS = ["authorization", "api_key", "x-api-key", "proxy-authorization", "cookie"] as const;

export const REDACT_PATHS: string[] = SECRET_HEADERS.flatMap((h) => [
  `req.headers["${h}"]`,
  `headers["${h}"]`,
  `request.headers["${h}"]`,
  `err.headers["${h}"]`,
]);

export function loggerOptions(level: string): LoggerOptions {
  return {
    level,
    redact: { paths: REDACT_PATHS, censor: "[redacted]" },
    // Stable names for log search: `time` ISO, `level` as a word.
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
  };
}

/** The process logger (main.ts) or a test's, writing to `destination` (stdout by default). */
export function createLogger(level: string, destination?: DestinationStream): Logger {
  return destination ? pino(loggerOptions(level), destination) : pino(loggerOptions(level));
}

/**
 * `log` with its info and warn lines written at debug (error and fatal
 * unchanged): the request logger of a probe or a scrape, whose refusals (a
 * /readyz 503 while the model loads or the server drains) are expected.
 */
export function atDebug<L extends Pick<BaseLogger, "debug" | "info" | "warn">>(log: L): L {
  const quiet = Object.create(log) as L;
  quiet.info = log.debug.bind(log);
  quiet.warn = log.debug.bind(log);
  // A child of it (a request logger given the organization's bindings) stays quiet too.
  const child = (log as { child?: (...args: unknown[]) => L }).child;
  if (typeof child === "function") (quiet as unknown as { child: unknown }).child = (...args: unknown[]) => atDebug(child.apply(log, args));
  return quiet;
}
