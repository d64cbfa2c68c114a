import { expect } from "vitest";
import { ERRORS, detailMessage } from "../../src/errors/catalogue.js";

interface Res {
  statusCode: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: string;
}

const ERROR_TYPES = new Set<string>(Object.values(ERRORS).map((e) => e.errorType));

/**
 * The spec's error shape: exact status, body `{detail, request_id}`, and
 * request_id equal to both request-id headers. `detail` in the shape the
 * official clients parse: for a 422 a non-empty list of `{loc: ["body", …],
 * msg, type}`, otherwise `{error_type, message}` with the catalogue's type.
 * Returns the detail's human message, as the SDKs compose it
 * (`questions.q1.criteria: …; state: …` for a 422).
 */
export function expectSpecError(res: Res, status: number): string {
  expect(res.statusCode, res.body).toBe(status);
  expect(String(res.headers["content-type"])).toMatch(/^application\/json/);
  const body = JSON.parse(res.body) as { detail: unknown; request_id: unknown };
  expect(Object.keys(body).sort()).toEqual(["detail", "request_id"]);
  if (status === 422) {
    expect(Array.isArray(body.detail), res.body).toBe(true);
    const issues = body.detail as { loc: unknown; msg: unknown; type: unknown }[];
    expect(issues.length).toBeGreaterThan(0);
    for (const i of issues) {
      expect(Object.keys(i).sort()).toEqual(["loc", "msg", "type"]);
      expect(Array.isArray(i.loc) && i.loc[0] === "body", res.body).toBe(true);
      expect(typeof i.msg === "string" && i.msg.length > 0, res.body).toBe(true);
      expect(typeof i.type === "string" && i.type.length > 0, res.body).toBe(true);
    }
  } else {
    const d = body.detail as { error_type?: unknown; message?: unknown };
    expect(d !== null && typeof d === "object" && !Array.isArray(d), res.body).toBe(true);
    expect(Object.keys(d).sort()).toEqual(["error_type", "message"]);
    expect(ERROR_TYPES.has(String(d.error_type)) || ["bad_request"].includes(String(d.error_type)), res.body).toBe(true);
    expect(typeof d.message === "string" && d.message.length > 0, res.body).toBe(true);
  }
  expect(typeof body.request_id).toBe("string");
  expect(res.headers["x-request-id"]).toBe(body.request_id);
  expect(res.headers["x-sdk-request-id"]).toBe(body.request_id);
  return detailMessage(body.detail);
}
