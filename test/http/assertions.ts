import { expect } from "vitest";

interface Res {
  statusCode: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: string;
}

/**
 * The spec's error shape: exact status, body `{detail, request_id}` with a
 * non-empty detail, and request_id equal to both request-id headers.
 * Returns the detail.
 */
export function expectSpecError(res: Res, status: number): string {
  expect(res.statusCode, res.body).toBe(status);
  expect(String(res.headers["content-type"])).toMatch(/^application\/json/);
  const body = JSON.parse(res.body) as { detail: unknown; request_id: unknown };
  expect(Object.keys(body).sort()).toEqual(["detail", "request_id"]);
  expect(typeof body.detail).toBe("string");
  expect((body.detail as string).length).toBeGreaterThan(0);
  expect(typeof body.request_id).toBe("string");
  expect(res.headers["x-request-id"]).toBe(body.request_id);
  expect(res.headers["x-sdk-request-id"]).toBe(body.request_id);
  return body.detail as string;
}
