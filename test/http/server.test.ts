/**
 * End to end over a real socket: listen on 127.0.0.1:0 and talk HTTP.
 */
import http from "node:http";
import net from "node:net";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LIMITS } from "../../src/validate/schema.js";
import { expectSpecError } from "./assertions.js";
import { makeTestApp, UUID, validBody, type TestApp } from "./helpers.js";

let t: TestApp;
let base: string;
let port: number;

beforeAll(async () => {
  t = await makeTestApp();
  await t.app.listen({ port: 0, host: "127.0.0.1" });
  port = (t.app.server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
});
afterAll(async () => {
  await t.close();
});

async function expectWireError(res: Response, status: number): Promise<string> {
  return expectSpecError({ statusCode: res.status, headers: Object.fromEntries(res.headers), body: await res.text() }, status);
}

describe("listening server", () => {
  it("answers POST /v1/systemone with 200 and the request id headers", async () => {
    const res = await fetch(`${base}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.key}`, "content-type": "application/json", "x-request-id": "e2e-1" },
      body: JSON.stringify(validBody),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toBe("e2e-1");
    expect(res.headers.get("x-sdk-request-id")).toBe("e2e-1");
    expect(await res.json()).toEqual({ model: "judge-latest", answers: {}, usage: { input_tokens: 0, output_tokens: 0 } });
  });

  it("answers /v1/judge/systemone the same way", async () => {
    const res = await fetch(`${base}/v1/judge/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.key}`, "content-type": "application/json" },
      body: JSON.stringify(validBody),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toMatch(UUID);
  });

  it("401 without a key, 404 for an unknown path, 422 for bad JSON", async () => {
    await expectWireError(
      await fetch(`${base}/v1/systemone`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" }),
      401,
    );
    await expectWireError(await fetch(`${base}/nope`), 404);
    const detail = await expectWireError(
      await fetch(`${base}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${t.key}`, "content-type": "application/json" },
        body: "{oops",
      }),
      422,
    );
    expect(detail).toMatch(/not valid JSON/);
  });

  it("413 on a Content-Length over 1 MiB, answered before the body is sent", async () => {
    const { status, headers, body } = await new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }>(
      (resolve, reject) => {
        const req = http.request(
          {
            host: "127.0.0.1",
            port,
            method: "POST",
            path: "/v1/systemone",
            headers: { "content-type": "application/json", "content-length": String(LIMITS.bodyBytes + 1) },
          },
          (res) => {
            let text = "";
            res.setEncoding("utf8");
            res.on("data", (c: string) => (text += c));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
          },
        );
        req.on("error", reject);
        req.flushHeaders(); // headers only; no body is ever written
      },
    );
    expect(status).toBe(413);
    expect(expectSpecError({ statusCode: status, headers, body }, 413)).toMatch(/1 MiB/);
  });

  it("malformed HTTP gets the spec body too", async () => {
    const raw = await new Promise<string>((resolve, reject) => {
      const s = net.connect(port, "127.0.0.1", () => s.write("THIS IS NOT HTTP\r\n\r\n"));
      let text = "";
      s.setEncoding("utf8");
      s.on("data", (c: string) => (text += c));
      s.on("close", () => resolve(text));
      s.on("error", reject);
    });
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    const id = /x-request-id: (\S+)/i.exec(raw)?.[1];
    expect(id).toMatch(UUID);
    expect(raw).toContain(`x-sdk-request-id: ${id}`);
    const body = JSON.parse(raw.slice(raw.indexOf("\r\n\r\n") + 4)) as { detail: { error_type: string; message: string }; request_id: string };
    expect(body.request_id).toBe(id);
    expect(body.detail).toEqual({ error_type: "bad_request", message: expect.stringMatching(/malformed/) });
  });
});
