/**
 * Compressed request bodies: `Content-Encoding` zstd, gzip, deflate or br
 * (and identity), decoded with the body limit applied to the OUTPUT, while
 * decoding: a decoder is stopped once it has produced more than 1 MiB, so a
 * small body that expands to gigabytes (a decompression bomb) costs at most
 * 1 MiB and a chunk of memory, then 413.
 *
 *   gzip, deflate, br   node:zlib, `maxOutputLength` (the decoder stops
 *                       within one 16 KiB chunk of the limit)
 *   zstd                node:zlib where Node has it (≥ 22.15 / 23.8),
 *                       otherwise fzstd (pure JS, Node 22.14); both behind
 *                       `checkZstdFrames` (zstd-frames.ts)
 *
 * Corrupt or truncated data is 422 naming the coding and what is wrong; an
 * unknown coding is 415 naming the supported ones. Nothing here is charged:
 * it all happens before the pipeline could place a hold.
 */
import zlib from "node:zlib";
import { Decompress as FzstdDecompress } from "fzstd";
import { AssayError, invalid } from "../errors/catalogue.js";
import { checkZstdFrames } from "./zstd-frames.js";

export type Coding = "zstd" | "gzip" | "deflate" | "br";

export const SUPPORTED_ENCODINGS = "zstd, gzip, deflate, br or identity";
/** Codings stacked in one header (`gzip, br`); more is refused (415). */
export const MAX_CODINGS = 2;

const NAMES: Record<string, Coding> = {
  zstd: "zstd",
  gzip: "gzip",
  "x-gzip": "gzip", // RFC 9110 §8.4.1.3: to be read as gzip
  deflate: "deflate",
  br: "br",
};

/**
 * `Content-Encoding` → the codings, in the order they were applied
 * (`identity` dropped). 415 for a coding not in SUPPORTED_ENCODINGS.
 */
export function parseContentEncoding(header: string | string[] | undefined): Coding[] {
  const value = Array.isArray(header) ? header.join(",") : (header ?? "");
  const codings: Coding[] = [];
  for (const token of value.split(",")) {
    const name = token.trim().toLowerCase();
    if (name === "" || name === "identity") continue;
    const coding = Object.hasOwn(NAMES, name) ? NAMES[name] : undefined;
    if (coding === undefined) {
      throw new AssayError(
        "UNSUPPORTED_MEDIA_TYPE",
        `Content-Encoding "${name.slice(0, 40)}" is not supported: send the body as ${SUPPORTED_ENCODINGS}`,
      );
    }
    codings.push(coding);
  }
  if (codings.length > MAX_CODINGS) {
    throw new AssayError(
      "UNSUPPORTED_MEDIA_TYPE",
      `Content-Encoding lists ${codings.length} codings; at most ${MAX_CODINGS} are decoded (${SUPPORTED_ENCODINGS})`,
    );
  }
  return codings;
}

type Decode = (input: Buffer, options: zlib.ZlibOptions, callback: (error: Error | null, output: Buffer) => void) => void;

/** node:zlib's zstd, on the Node versions that have it (not in @types/node 20). */
const nativeZstd = (zlib as unknown as { zstdDecompress?: Decode }).zstdDecompress;

/** Which zstd decoder this process uses (tests report it). */
export const ZSTD_DECODER: "node:zlib" | "fzstd" = nativeZstd ? "node:zlib" : "fzstd";

function tooLarge(coding: Coding, limit: number): AssayError {
  return new AssayError(
    "BODY_TOO_LARGE",
    `request body is larger than 1 MiB (${limit} bytes) once decoded (Content-Encoding ${coding}); send less`,
  );
}

const corruptPrefix = (coding: Coding) => `request body could not be decoded as ${coding} (its Content-Encoding)`;

function zlibDecode(decode: Decode, coding: Coding, input: Buffer, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    decode(input, { maxOutputLength: limit }, (error, output) => {
      if (!error) return resolve(output);
      if ((error as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE") return reject(tooLarge(coding, limit));
      const truncated = /unexpected end of file/i.test(error.message) ? " (truncated)" : "";
      reject(invalid(`${corruptPrefix(coding)}: ${error.message.slice(0, 200)}${truncated}`));
    });
  });
}

/**
 * Blocks fzstd decodes in one body. It moves its whole window (≤ 1.25 MiB
 * here) once per block, empty blocks included, so this bounds a body of
 * many tiny blocks to about 50 ms; a body of 1 MiB compressed in one pass
 * has about 9. Native zstd has no such cost and no such cap.
 */
export const FZSTD_MAX_BLOCKS = 1024;

/** fzstd's streaming decoder over the frames, stopped from its block callback once the output passes the limit. */
function fzstdDecode(frames: Buffer[], limit: number): Buffer {
  const parts: Uint8Array[] = [];
  let total = 0;
  let blocks = 0;
  const stop = { tooLarge: new Error("over the limit"), tooManyBlocks: new Error("too many blocks") };
  const onBlock = (chunk: Uint8Array) => {
    total += chunk.length;
    if (total > limit) throw stop.tooLarge;
    if (++blocks > FZSTD_MAX_BLOCKS) throw stop.tooManyBlocks;
    parts.push(chunk);
  };
  try {
    for (const frame of frames) new FzstdDecompress(onBlock).push(frame, true);
  } catch (e) {
    if (e === stop.tooLarge) throw tooLarge("zstd", limit);
    if (e === stop.tooManyBlocks) throw invalid(`${corruptPrefix("zstd")}: more than ${FZSTD_MAX_BLOCKS} zstd blocks; compress the body in one pass`);
    throw invalid(`${corruptPrefix("zstd")}: ${(e instanceof Error ? e.message : String(e)).slice(0, 200)}`);
  }
  return Buffer.concat(parts, total);
}

/** node:zlib's zstd, one frame at a time (it stops after the first), each held to what is left of the limit. */
async function nativeZstdDecode(decode: Decode, frames: Buffer[], limit: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let total = 0;
  for (const frame of frames) {
    // At least 1: maxOutputLength 0 is out of range; a byte past the limit is caught below.
    const part = await zlibDecode(decode, "zstd", frame, Math.max(1, limit - total));
    total += part.length;
    if (total > limit) throw tooLarge("zstd", limit);
    parts.push(part);
  }
  return Buffer.concat(parts, total);
}

/** zlib's `deflate` is the zlib format (RFC 1950); some clients send raw deflate (RFC 1951): both are read. */
function isZlibWrapped(input: Buffer): boolean {
  return input.length >= 2 && (input[0]! & 0x0f) === 8 && ((input[0]! << 8) | input[1]!) % 31 === 0;
}

async function decodeOne(coding: Coding, input: Buffer, limit: number): Promise<Buffer> {
  switch (coding) {
    case "gzip":
      return zlibDecode(zlib.gunzip, coding, input, limit);
    case "deflate":
      return zlibDecode(isZlibWrapped(input) ? zlib.inflate : zlib.inflateRaw, coding, input, limit);
    case "br":
      return zlibDecode(zlib.brotliDecompress as Decode, coding, input, limit);
    case "zstd": {
      const frames = checkZstdFrames(input, limit, {
        tooLarge: tooLarge("zstd", limit).message,
        corrupt: corruptPrefix("zstd"),
      });
      return nativeZstd ? nativeZstdDecode(nativeZstd, frames, limit) : fzstdDecode(frames, limit);
    }
  }
}

/**
 * The body as sent → the body as meant: each coding undone, last applied
 * first; every stage's output held to `limit` bytes. An empty body stays
 * empty (the JSON decoder reports it).
 */
export async function decodeContent(input: Buffer, codings: readonly Coding[], limit: number): Promise<Buffer> {
  let bytes = input;
  for (let i = codings.length - 1; i >= 0; i--) {
    if (bytes.length === 0) break;
    bytes = await decodeOne(codings[i]!, bytes, limit);
  }
  return bytes;
}
