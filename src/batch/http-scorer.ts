/**
 * Scoring against a running server: POST {url}/v1/systemone with a Bearer
 * key. A status answer (200, 4xx, 5xx) becomes the line's record; a server
 * that cannot be reached ends the run (resume once it is back), so that
 * an outage never fills the output with error lines.
 */
import { detailMessage } from "../errors/catalogue.js";
import type { RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import { ScoreError } from "./records.js";
import type { Scorer } from "./scorer.js";

export class ServerUnreachable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ServerUnreachable";
  }
}

export interface HttpScorerOptions {
  url: string;
  key: string;
  /** Per-request timeout (default 10 minutes: a long request on a CPU server is slow, not dead). */
  timeoutMs?: number;
  /** Attempts on a connection failure before giving up (default 3). */
  connectAttempts?: number;
  family?: (model: string) => "general" | "factcheck" | "codesearch" | null;
}

export class HttpScorer implements Scorer {
  readonly description: string;
  private readonly endpoint: string;

  constructor(private readonly opts: HttpScorerOptions) {
    const base = opts.url.replace(/\/+$/, "");
    this.endpoint = /\/v1\/(judge\/)?systemone$/.test(base) ? base : `${base}/v1/systemone`;
    this.description = this.endpoint;
    if (opts.family) this.family = opts.family;
  }

  family?: (model: string) => "general" | "factcheck" | "codesearch" | null;

  async score(request: RequestEnvelope, requestId: string): Promise<SystemOneResponse> {
    const attempts = this.opts.connectAttempts ?? 3;
    let lastError: unknown;
    for (let a = 0; a < attempts; a++) {
      let res: Response;
      try {
        res = await fetch(this.endpoint, {
          method: "POST",
          headers: {
            authorization: `Bearer ${this.opts.key}`,
            "content-type": "application/json",
            "x-request-id": requestId,
          },
          body: JSON.stringify(request),
          signal: AbortSignal.timeout(this.opts.timeoutMs ?? 600_000),
        });
      } catch (e) {
        lastError = e;
        await new Promise((r) => setTimeout(r, 500 * 2 ** a));
        continue;
      }
      const text = await res.text();
      let body: unknown = null;
      try {
        body = JSON.parse(text);
      } catch {
        // not JSON: reported below
      }
      if (res.status === 200 && body && typeof body === "object") return body as SystemOneResponse;
      const detail =
        body && typeof body === "object" && "detail" in body
          ? detailMessage((body as { detail: unknown }).detail)
          : `HTTP ${res.status}: ${text.slice(0, 200)}`;
      const retry = Number(res.headers.get("retry-after"));
      throw new ScoreError(res.status, detail, undefined, Number.isFinite(retry) && retry > 0 ? retry : undefined);
    }
    const why = lastError instanceof Error ? `${lastError.message}${lastError.cause ? ` (${String((lastError.cause as Error).message ?? lastError.cause)})` : ""}` : String(lastError);
    throw new ServerUnreachable(`cannot reach ${this.endpoint}: ${why}`);
  }

  async close(): Promise<void> {}
}
