/**
 * The structured log: pino JSON lines, one logger per process. Secrets never
 * reach it: the redaction paths below cover every place a credential header
 * could be logged (fastify's request serializer, our own request line, error
 * objects that carry headers), and API keys are never put in log fields.
 */
import { pino, type DestinationStream, type Logger, type LoggerOptions } from "pino";

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
