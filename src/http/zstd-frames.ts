/**
 * A walk over the frame and block headers of a zstd body (RFC 8878 §3.1)
 * before any of it is decoded: a few header reads per block, no decoding.
 *
 *   frame      magic 28 B5 2F FD | descriptor | window? | dictionary id? | content size?
 *              | block … block(last) | checksum?
 *   block      3 bytes: last (1 bit), type (2: raw, RLE, compressed, reserved), size (21)
 *              then `size` bytes (raw, compressed) or 1 byte (RLE)
 *   skippable  magic 5? 2A 4D 18 | 4-byte size | that many bytes
 *
 * It refuses, before a decoder allocates anything:
 *   - a body that certainly decodes to more than the body limit → 413: the
 *     content sizes the frames declare, or the raw and RLE blocks (whose
 *     sizes their headers give), add up to more;
 *   - data that ends inside a frame, a reserved bit or block type, a block
 *     over 128 KiB, a dictionary (the server has none), or more than
 *     MAX_FRAMES frames → 422.
 * And it lowers a frame's declared window to WINDOW_CAP when larger. The
 * window is how far back a match may reach; the decoded body is at most
 * 1 MiB, so no match in a body we accept reaches further than that, and a
 * smaller window changes nothing a valid body decodes to. What it bounds: a
 * 20-byte frame may declare a window of up to 2 GiB (3.75 TiB in the format),
 * which the decoders allocate up front — native zstd up to its 128 MiB
 * default limit, fzstd (Node 22.14) anything below 2 GiB, once per frame, and
 * fzstd then moves its whole window once per block (content-encoding.ts
 * caps its blocks).
 *
 * It returns the data frames one by one (skippable frames dropped): Node's
 * own zstd decoder stops at the end of the first frame and silently drops
 * the rest (Node 24.21: a skippable frame first decodes to nothing), so each
 * frame is decoded on its own and the outputs are joined, as RFC 8878 says.
 */
import { AssayError, invalid } from "../errors/catalogue.js";

const FRAME_MAGIC = 0xfd2fb528;
const SKIPPABLE_MAGIC = 0x184d2a50; // low 4 bits free
/** Frames (skippable ones included) in one body. A body compressed in one pass is one frame. */
export const MAX_FRAMES = 16;
/** 1.25 MiB: the body limit plus two blocks of 128 KiB, the most a decoder can have produced before it is stopped. */
export const WINDOW_CAP = 1.25 * 1024 * 1024;
/** Window descriptor for WINDOW_CAP: exponent 10 (2^20), mantissa 2 (+ 2/8 of it). */
const WINDOW_CAP_DESCRIPTOR = (10 << 3) | 2;
const MAX_BLOCK = 128 * 1024;

export interface ZstdCheckMessages {
  /** 413 detail: the frames declare more than the limit. */
  tooLarge: string;
  /** Prefix of a 422 detail: what could not be decoded. */
  corrupt: string;
}

/**
 * Checks the frame structure of `input` and returns its data frames, to be
 * decoded one by one: views of `input`, or of a copy whose window
 * descriptors were lowered.
 */
export function checkZstdFrames(input: Buffer, limit: number, messages: ZstdCheckMessages): Buffer[] {
  const n = input.length;
  const bad = (why: string) => invalid(`${messages.corrupt}: ${why}`);
  const truncated = () => bad("the data ends inside a frame (truncated)");
  let out = input;
  const ranges: [number, number][] = [];
  let pos = 0;
  let frames = 0;
  /** Bytes the frames declare (content sizes), and bytes the raw and RLE blocks certainly produce. */
  let declared = 0;
  let known = 0;
  const count = () => {
    if (++frames > MAX_FRAMES) throw bad(`more than ${MAX_FRAMES} zstd frames; compress the body in one pass`);
  };
  const over = () => new AssayError("BODY_TOO_LARGE", messages.tooLarge);

  while (pos < n) {
    if (n - pos < 4) throw truncated();
    const magic = input.readUInt32LE(pos);
    if ((magic & 0xfffffff0) >>> 0 === SKIPPABLE_MAGIC) {
      if (n - pos < 8) throw truncated();
      pos += 8 + input.readUInt32LE(pos + 4);
      if (pos > n) throw truncated();
      count();
      continue;
    }
    if (magic !== FRAME_MAGIC) throw bad(pos === 0 ? "not zstd data (no zstd frame magic number)" : `unexpected bytes after a zstd frame at byte ${pos}`);
    const start = pos;
    pos += 4;
    if (pos >= n) throw truncated();
    const fhd = input[pos]!;
    const fcsFlag = fhd >> 6;
    const singleSegment = (fhd >> 5) & 1;
    if (fhd & 0x08) throw bad("a zstd frame header sets its reserved bit");
    const hasChecksum = (fhd >> 2) & 1;
    const dictBytes = [0, 1, 2, 4][fhd & 3]!;
    const fcsBytes = [singleSegment, 2, 4, 8][fcsFlag]!;
    const headerEnd = pos + 1 + (singleSegment ? 0 : 1) + dictBytes + fcsBytes;
    if (headerEnd > n) throw truncated();
    let p = pos + 1;
    if (!singleSegment) {
      const exponent = input[p]! >> 3;
      const base = 2 ** (10 + exponent);
      const window = base + (base / 8) * (input[p]! & 7);
      if (window > WINDOW_CAP) {
        if (out === input) out = Buffer.from(input);
        out[p] = WINDOW_CAP_DESCRIPTOR;
      }
      p += 1;
    }
    if (dictBytes > 0 && input.readUIntLE(p, dictBytes) !== 0) throw bad("the zstd frame needs a dictionary; send it without one");
    p += dictBytes;
    if (fcsBytes > 0) {
      // 8-byte sizes: the high half alone says whether it is over the limit.
      const size =
        fcsBytes === 8 ? input.readUInt32LE(p) + input.readUInt32LE(p + 4) * 2 ** 32 : input.readUIntLE(p, fcsBytes) + (fcsBytes === 2 ? 256 : 0);
      declared += size;
      if (declared > limit) throw over();
    }
    pos = headerEnd;
    count();

    for (;;) {
      if (n - pos < 3) throw truncated();
      const header = input[pos]! | (input[pos + 1]! << 8) | (input[pos + 2]! << 16);
      const last = header & 1;
      const type = (header >> 1) & 3;
      const size = header >>> 3;
      if (type === 3) throw bad("a zstd block has the reserved block type");
      if (size > MAX_BLOCK) throw bad("a zstd block is larger than 128 KiB");
      pos += 3 + (type === 1 ? 1 : size);
      if (pos > n) throw truncated();
      if (type !== 2) known += size;
      if (known > limit) throw over();
      if (last) break;
    }
    if (hasChecksum) {
      pos += 4;
      if (pos > n) throw truncated();
    }
    ranges.push([start, pos]);
  }
  return ranges.map(([start, end]) => out.subarray(start, end));
}
