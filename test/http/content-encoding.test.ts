/**
 * Compressed request bodies (Content-Encoding zstd, gzip, deflate, br,
 * identity) through the HTTP layer: decoded before JSON, after auth and the
 * concurrency slot; the 1 MiB limit applies to the decoded body and stops
 * the decoder (413); corrupt or truncated data is 422; an unknown coding is
 * 415; none of it is charged. The pipeline is the billing fake (it places a
 * real hold), so "not charged" is read from the ledger.
 *
 * zstd runs on node:zlib where Node has it (≥ 22.15) and on fzstd on Node
 * 20: this file passes on both (the quick tier runs it on the current LTS).
 */
import zlib from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FZSTD_MAX_BLOCKS, ZSTD_DECODER } from "../../src/http/content-encoding.js";
import { MAX_FRAMES } from "../../src/http/zstd-frames.js";
import { LIMITS } from "../../src/validate/schema.js";
import { expectSpecError } from "./assertions.js";
import {
  LARGE_BODY_TEXT,
  LARGE_BODY_ZSTD,
  LARGE_BODY_ZSTD_WINDOW_128MIB,
  TEXT_BOMB_ZSTD,
  compress,
  largeBody,
  nativeZstdCompress,
  zstdFrame,
  zstdRaw,
  zstdZeros,
} from "./compressed.js";
import { FakeTokenCountPipelineForBilling } from "./fake-pipeline.js";
import { makeTestApp, validBody, type TestApp } from "./helpers.js";

let t: TestApp<FakeTokenCountPipelineForBilling>;
beforeAll(async () => {
  t = await makeTestApp({ pipeline: new FakeTokenCountPipelineForBilling() });
});
afterAll(async () => {
  await t.close();
});

const send = (payload: Buffer | string, encoding: string | undefined, key: string | null = t.key) =>
  t.app.inject({
    method: "POST",
    url: "/v1/systemone",
    headers: {
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...(encoding !== undefined ? { "content-encoding": encoding } : {}),
    },
    payload,
  });

const charged = () => t.accounts.ledger(t.orgId).filter((e) => e.kind === "settle").length;

/** `fn` must leave the ledger without a new charge, no hold, and the slot free. */
async function notCharged<T>(fn: () => Promise<T>): Promise<T> {
  const before = charged();
  const calls = t.pipeline.calls.length;
  const out = await fn();
  expect(charged()).toBe(before);
  expect(t.pipeline.calls.length, "the pipeline was reached").toBe(calls);
  expect(t.accounts.balance(t.orgId, Date.now()).heldMicro).toBe(0);
  expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
  return out;
}

const JSON_BODY = Buffer.from(JSON.stringify(validBody));
const CODINGS = ["gzip", "deflate", "deflate-raw", "br", "zstd"] as const;
const headerFor = (c: (typeof CODINGS)[number]) => (c === "deflate-raw" ? "deflate" : c);

describe(`decoded bodies (zstd decoder here: ${ZSTD_DECODER})`, () => {
  it.each(CODINGS)("%s: decoded, answered and charged like the plain body", async (coding) => {
    const res = await send(compress(coding, JSON_BODY), headerFor(coding));
    expect(res.statusCode, res.body).toBe(200);
    expect(t.pipeline.calls.at(-1)!.envelope).toEqual(validBody);
  });

  it("a large state compressed by the reference zstd CLI (compressed blocks, declared size) decodes exactly", async () => {
    expect(LARGE_BODY_ZSTD.length).toBeLessThan(LARGE_BODY_TEXT.length / 20);
    const res = await send(LARGE_BODY_ZSTD, "zstd");
    expect(res.statusCode, res.body).toBe(200);
    expect(t.pipeline.calls.at(-1)!.envelope).toEqual(largeBody());
  });

  it("a frame declaring a 128 MiB window (zstd --long=27 from a pipe, no size) decodes exactly", async () => {
    const res = await send(LARGE_BODY_ZSTD_WINDOW_128MIB, "zstd");
    expect(res.statusCode, res.body).toBe(200);
    expect(t.pipeline.calls.at(-1)!.envelope).toEqual(largeBody());
  });

  it("a frame declaring a 2 GiB window, a skippable frame and two frames in a row decode", async () => {
    const [a, b] = [JSON_BODY.subarray(0, 20), JSON_BODY.subarray(20)];
    const skippable = Buffer.concat([Buffer.from([0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0]), Buffer.from("abc")]);
    for (const body of [
      zstdRaw(JSON_BODY, { windowLog: 31 }),
      Buffer.concat([skippable, zstdRaw(JSON_BODY)]),
      Buffer.concat([zstdRaw(a), zstdRaw(b, { windowLog: 30, contentSize: b.length })]),
    ]) {
      const res = await send(body, "zstd");
      expect(res.statusCode, res.body).toBe(200);
      expect(t.pipeline.calls.at(-1)!.envelope).toEqual(validBody);
    }
  });

  it("names are case-insensitive; x-gzip is gzip; identity is nothing; two stacked codings are undone last-first", async () => {
    const gz = zlib.gzipSync(JSON_BODY);
    for (const [payload, encoding] of [
      [gz, "GZIP"],
      [gz, "x-gzip"],
      [gz, "gzip, identity"],
      [JSON_BODY, "identity"],
      [JSON_BODY, ""],
      [zlib.brotliCompressSync(gz), "gzip, br"],
    ] as const) {
      const res = await send(payload, encoding);
      expect(res.statusCode, `${encoding}: ${res.body}`).toBe(200);
      expect(t.pipeline.calls.at(-1)!.envelope).toEqual(validBody);
    }
  });

  it("exactly 1 MiB decoded is accepted; one byte more is 413", async () => {
    const head = JSON.stringify({ ...validBody, state: "" });
    const exact = Buffer.from(JSON.stringify({ ...validBody, state: "y".repeat(LIMITS.bodyBytes - Buffer.byteLength(head)) }));
    expect(exact.length).toBe(LIMITS.bodyBytes);
    for (const coding of CODINGS) {
      const ok = await send(compress(coding, exact), headerFor(coding));
      expect(ok.statusCode, `${coding}: ${ok.body.slice(0, 200)}`).toBe(200);
      const over = Buffer.concat([exact, Buffer.from(" ")]);
      const res = await notCharged(() => send(compress(coding, over), headerFor(coding)));
      expect(expectSpecError(res, 413), coding).toMatch(/larger than 1 MiB \(1048576 bytes\) once decoded/);
    }
  });
});

describe("decompression bombs: 413 after at most 1 MiB of output, not charged", () => {
  const ZEROS = 50 * 1024 * 1024;
  let zeros: Buffer;
  beforeAll(() => {
    zeros = Buffer.alloc(ZEROS);
  });

  it.each(["gzip", "deflate", "br"] as const)("50 MiB of zeros, %s", async (coding) => {
    const bomb = compress(coding, zeros);
    expect(bomb.length).toBeLessThan(LIMITS.bodyBytes / 10);
    const res = await notCharged(() => send(bomb, coding));
    expect(expectSpecError(res, 413)).toMatch(new RegExp(`once decoded \\(Content-Encoding ${coding}\\)`));
  });

  it("50 MiB of zeros, zstd RLE blocks (1.6 KB): refused from the block headers alone", async () => {
    const bomb = zstdZeros(ZEROS);
    expect(bomb.length).toBeLessThan(2_000);
    expect(expectSpecError(await notCharged(() => send(bomb, "zstd")), 413)).toMatch(/once decoded \(Content-Encoding zstd\)/);
  });

  it("a zstd frame that declares a content size over 1 MiB is refused from its header", async () => {
    const lie = zstdFrame([{ raw: JSON_BODY }], { windowLog: 20, contentSize: 4 * 2 ** 30 });
    expect(expectSpecError(await notCharged(() => send(lie, "zstd")), 413)).toMatch(/once decoded/);
  });

  it("8 MiB of text in 752 bytes of compressed zstd blocks, size not declared: the decoder is stopped at the limit", async () => {
    expect(expectSpecError(await notCharged(() => send(TEXT_BOMB_ZSTD, "zstd")), 413)).toMatch(/once decoded \(Content-Encoding zstd\)/);
  });

  it("the limit holds over frames: 600 KiB in a first frame, then a bomb in a second", async () => {
    const first = zstdRaw(Buffer.alloc(600 * 1024, 0x20), { windowLog: 20 });
    expect(expectSpecError(await notCharged(() => send(Buffer.concat([first, TEXT_BOMB_ZSTD]), "zstd")), 413)).toMatch(/once decoded/);
  });

  it.runIf(nativeZstdCompress)("50 MiB of zeros through node:zlib's zstd compressor", async () => {
    const bomb = nativeZstdCompress!(zeros);
    expect(expectSpecError(await notCharged(() => send(bomb, "zstd")), 413)).toMatch(/once decoded/);
  });

  it("a bomb without a key is 401: no decoder runs before auth", async () => {
    const res = await notCharged(() => send(zlib.gzipSync(zeros), "gzip", null));
    expectSpecError(res, 401);
  });
});

describe("corrupt, truncated and mismatched bodies: 422 naming the coding, not charged", () => {
  const cases: [string, Buffer, string, RegExp][] = [
    ["gzip cut in half", zlib.gzipSync(JSON_BODY).subarray(0, 30), "gzip", /decoded as gzip.*\(truncated\)/],
    ["gzip with a flipped byte", flip(zlib.gzipSync(JSON_BODY), 12), "gzip", /could not be decoded as gzip/],
    ["deflate cut short", zlib.deflateSync(JSON_BODY).subarray(0, 20), "deflate", /decoded as deflate.*\(truncated\)/],
    ["br cut short", zlib.brotliCompressSync(JSON_BODY).subarray(0, 20), "br", /could not be decoded as br/],
    ["zstd cut short", LARGE_BODY_ZSTD.subarray(0, 500), "zstd", /decoded as zstd.*truncated/],
    // node:zlib checks the frame's checksum; fzstd does not, and its garbage fails as UTF-8 or JSON.
    ["zstd with corrupt compressed blocks", flipAll(LARGE_BODY_ZSTD, 40, 80), "zstd", /could not be decoded as zstd|not valid (JSON|UTF-8)/],
    ["zstd: a reserved block type", zstdFrame([{ reservedType: true }], { contentSize: 0 }), "zstd", /reserved block type/],
    ["zstd: the reserved header bit", zstdFrame([{ raw: JSON_BODY }], { contentSize: JSON_BODY.length, reservedBit: true }), "zstd", /reserved bit/],
    ["zstd: a dictionary", zstdFrame([{ raw: JSON_BODY }], { contentSize: JSON_BODY.length, dictionaryId: 7 }), "zstd", /dictionary/],
    ["zstd: bytes after the frame", Buffer.concat([zstdRaw(JSON_BODY), Buffer.from("trailing")]), "zstd", /unexpected bytes after a zstd frame/],
    ["zstd: too many frames", Buffer.concat(Array.from({ length: MAX_FRAMES + 1 }, () => zstdRaw(Buffer.from(" ")))), "zstd", /more than 16 zstd frames/],
    ["plain JSON sent as gzip", JSON_BODY, "gzip", /could not be decoded as gzip/],
    ["plain JSON sent as zstd", JSON_BODY, "zstd", /not zstd data/],
    ["plain JSON sent as br", JSON_BODY, "br", /could not be decoded as br/],
    ["gzip sent as zstd", zlib.gzipSync(JSON_BODY), "zstd", /not zstd data/],
    ["zstd sent as gzip", LARGE_BODY_ZSTD, "gzip", /could not be decoded as gzip/],
    ["gzip sent as deflate", zlib.gzipSync(JSON_BODY), "deflate", /could not be decoded as deflate/],
  ];
  it.each(cases)("%s", async (_name, payload, encoding, detail) => {
    const res = await notCharged(() => send(payload, encoding));
    expect(expectSpecError(res, 422)).toMatch(detail);
  });

  it("an empty compressed body is 422 'empty', as an empty plain one", async () => {
    expect(expectSpecError(await notCharged(() => send(Buffer.alloc(0), "gzip")), 422)).toMatch(/empty/);
  });

  it("valid compression of something that is not a request: the JSON and envelope 422s", async () => {
    expect(expectSpecError(await notCharged(() => send(zlib.gzipSync("{not json"), "gzip")), 422)).toMatch(/not valid JSON/);
    expect(expectSpecError(await notCharged(() => send(compress("zstd", Buffer.from('{"state":1}')), "zstd")), 422)).toMatch(/state/);
  });

  it.runIf(ZSTD_DECODER === "fzstd")(`fzstd (Node 22.14): more than ${FZSTD_MAX_BLOCKS} blocks is 422`, async () => {
    const blocks = Array.from({ length: FZSTD_MAX_BLOCKS + 1 }, (_, i) => ({ raw: Buffer.from(i === 0 ? JSON_BODY : "") }));
    expect(expectSpecError(await notCharged(() => send(zstdFrame(blocks, { windowLog: 20 }), "zstd")), 422)).toMatch(/more than 1024 zstd blocks/);
  });
});

describe("415 for codings the server does not decode (before auth, like Content-Type)", () => {
  it.each(["compress", "x-compress", "lz4", "zstd;q=1", "pack200-gzip", "gzip, gzip, gzip"])("%s", async (encoding) => {
    const res = await notCharged(() => send(JSON_BODY, encoding, null));
    const detail = expectSpecError(res, 415);
    expect(detail).toContain("zstd, gzip, deflate, br or identity");
  });
});

function flip(b: Buffer, at: number): Buffer {
  const c = Buffer.from(b);
  c[at] = c[at]! ^ 0xff;
  return c;
}

function flipAll(b: Buffer, from: number, to: number): Buffer {
  const c = Buffer.from(b);
  for (let i = from; i < to; i++) c[i] = c[i]! ^ 0x5a;
  return c;
}
