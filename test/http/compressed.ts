/**
 * Compressed request bodies for the HTTP tests, on every Node line: a zstd
 * frame builder (raw and RLE blocks are zstd any decoder must read, and they
 * let a test declare any window, content size or block layout), and zstd
 * files made by the reference CLI (zstd 1.5.4) for compressed blocks, which
 * Node 22.14 cannot make (node:zlib has zstd from 22.15 / 23.8):
 *
 *   LARGE_BODY_TEXT > body.json
 *   zstd -3 body.json -o body.json.zst                        LARGE_BODY_ZSTD (content size declared)
 *   cat body.json | zstd -3 --long=27 -c > body-long.zst       LARGE_BODY_ZSTD_WINDOW_128MIB (no size; 128 MiB window)
 *   0123456789abcdefghijklmnopqrstuvwxyz repeated to 8 MiB | zstd -19 --no-content-size
 *                                                              TEXT_BOMB_ZSTD (8 MiB in 752 bytes)
 */
import zlib from "node:zlib";

/** A request body of 30,006 bytes that compresses 31:1. */
export function largeBody(): { model: string; state: string; questions: Record<string, unknown> } {
  const state = Array.from({ length: 400 }, (_, i) => `Line ${i}: the parcel for order #${1000 + i} arrived late and the box was crushed.`).join(" ");
  return { model: "judge-latest", state, questions: { q1: { type: "noul", instructions: "The text is about a delivery." } } };
}
export const LARGE_BODY_TEXT = JSON.stringify(largeBody());

export const LARGE_BODY_ZSTD = Buffer.from(
    "KLUv/WQ2dJUdABpAHAkhYEtTbIei0cgN5O+KPVLij+hIOiiT3d07pRw1HzIgiIMDnQB4AHUAd3d3d3d3d3d3Z2ZmZmZmZmZmZlZVVVVVVVVVVV" +
    "VFRERERERERERE9P////////+2bdu2bdu23bZt27Zt2zYT8c6siui3W0RAQlFwPBoJiAPRAHHAKJBYQCDKglggCYWBotFAIDNTAEhDSTQYSINh" +
    "AFkoCQ2EAkRRWJDDIMqCYkBySJQFsTgShGRxKAtiEUA5kHggSA7JQkkwEiQMAePxODMzMzMzMzMzMxMRERERERERERHx7u7u7u7u7u7uzszMzM" +
    "zMzMzMzKyqqqqqqqqqqqqKiIiIiIiIiIiI6P////////9t27Zt27Ztu23btm3btu10pjOd6UxnOtOZznSm08zMzMzMzMzMzExERERERERERETE" +
    "C23n8/l8Pp/P5/P5fD6fz+fz+TwzMzMzMzMzMzMTERERERERERER8e7u7u7u7u7u7s7MzMzMzMzMzMysqqqqqqqqqqqqioiIiIiIiIiIiOj///" +
    "//////bdu2bdu2bbtt27Zt27Ztx+PxeDwej8fj8Xg8Ho/HAQ0NDYmABw2FgWKhJBAEsjwYBRCIQ4EsDpQFURQIJAmPxuJYUCQIyeLBWEgOiaLg" +
    "wZIwHJIuSBgOiWOBoVgcymNBgpBkZmZmZmZmZmZmIiIiIiIiIiIiIt7d3d3d3d3d3d2ZmZmZmZmZmZmZVVVVVVVVVVVVVRERERERERERERH9//" +
    "//////v23btm3btm23bdu2bds2gyGoIqhz/9gaA7LPSLUaEkgQQBD4X8MueIUAfztTud/u7v/zzpm7/447Z9buP+6Omfv/nHPW7v/j3pm1+5u7" +
    "Y+b6P+6ctfv+uHdm7/7n7pg5/98uRC9ELIhRikeKR4pHikeKR4pHtHdm7v7mzpm5/4875+z+P+6dmbvfuXNmzv/jzjm79493Z+7uf+6cmfb/uH" +
    "PMrv/j3Rm7+5/47PXs9ez17NXZ69nr2evZ69nr2eadmfvvuTtm5//z7ky7789xZ+b+a+6c2fn/uDvH7v9z3pm5/5w7Z3b8P+7OsXv/PHfm7u9+" +
    "j5fIb8/eW0Wo+o4QGr/Pg7bv46Dz+2zQ9H0YtH+fBV3fR0Hj90nQ9n0CQTMzkqr3Yo4Rqe4TM0NUdi/NjKDqvVhnRKu7xIwRld0LM0Ooei/GGa" +
    "nqXjFrRGX3jpzj0xyf5fgkBx/j+BDXR7g+gesz59sf3lQpkWn3rDz+TBhwoB7A0QpXb1ec",
  "base64",
);

export const LARGE_BODY_ZSTD_WINDOW_128MIB = Buffer.from(
    "KLUv/QSIlR0AGkAcCSFgS1Nsh6LRyA3k74o9UuKP6Eg6KJPd3TulHDUfMiCIgwOdAHgAdQB3d3d3d3d3d3dnZmZmZmZmZmZmVlVVVVVVVVVVVU" +
    "VERERERERERET0/////////7Zt27Zt27bdtm3btm3bNhPxzqyK6LdbREBCUXA8GgmIA9EAccAokFhAIMqCWCAJhYGi0UAgM1MASENJNBhIg2EA" +
    "WSgJDYQCRFFYkMMgyoJiQHJIlAWxOBKEZHEoC2IRQDmQeCBIDslCSTASJAwB4/E4MzMzMzMzMzMzExEREREREREREfHu7u7u7u7u7u7OzMzMzM" +
    "zMzMzMrKqqqqqqqqqqqoqIiIiIiIiIiIjo/////////23btm3btm27bdu2bdu27XSmM53pTGc605nOdKbTzMzMzMzMzMzMTERERERERERERMQL" +
    "befz+Xw+n8/n8/l8Pp/P5/P5PDMzMzMzMzMzMxMRERERERERERHx7u7u7u7u7u7uzszMzMzMzMzMzKyqqqqqqqqqqqqKiIiIiIiIiIiI6P////" +
    "////9t27Zt27Ztu23btm3btm3H4/F4PB6Px+PxeDwej8cBDQ0NiYAHDYWBYqEkEASyPBgFEIhDgSwOlAVRFAgkCY/G4lhQJAjJ4sFYSA6JouDB" +
    "kjAcki5IGA6JY4GhWBzKY0GCkGRmZmZmZmZmZmYiIiIiIiIiIiIi3t3d3d3d3d3d3ZmZmZmZmZmZmZlVVVVVVVVVVVVVEREREREREREREf3///" +
    "////+/bdu2bdu2bbdt27Zt2zaDIagiqHP/2BoDss9ItRoSSBBAEPhfwy54hQB/O1O53+7u//POmbv/jjtn1u4/7o6Z+/+cc9bu/+PembX7m7tj" +
    "5vo/7py1+/64d2bv/ufumDn/3y5EL0QsiFGKR4pHikeKR4pHike0d2bu/ubOmbn/jzvn7P4/7p2Zu9+5c2bO/+POObv3j3dn7u5/7pyZ9v+4c8" +
    "yu/+PdGbv7n/js9ez17PXs1dnr2evZ69nr2evZ5p2Z+++5O2bn//PuTLvvz3Fn5v5r7pzZ+f+4O8fu/3Pembn/nDtndvw/7s6xe/88d+bu736P" +
    "l8hvz95bRaj6jhAav8+Dtu/joPP7bND0fRi0f58FXd9HQeP3SdD2fQJBMzOSqvdijhGp7hMzQ1R2L82MoOq9WGdEq7vEjBGV3QszQ6h6L8YZqe" +
    "peMWtEZfeOnOPTHJ/l+CQHH+P4ENdHuD6B6zPn2x/eVCmRafesPP5MGHCgHsDRCldvV5w=",
  "base64",
);

/** 8 MiB of text. */
export const TEXT_BOMB_BYTES = 8 * 1024 * 1024;
export const TEXT_BOMB_ZSTD = Buffer.from(
    "KLUv/QRodAEARAIwMTIzNDU2Nzg5YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoBAMz+P7l6AkQAAAABAP3/J1dARAAAAAEA/f85AAJEAAAAAQ" +
    "D9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQAC" +
    "RAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQ" +
    "D9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQAC" +
    "RAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQ" +
    "D9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQAC" +
    "RAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQ" +
    "D9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQAC" +
    "RAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJEAAAAAQD9/zkAAkQAAAABAP3/OQACRAAAAAEA/f85AAJFAAAAAQ" +
    "D9/zkAAgOWOgA=",
  "base64",
);

// ------------------------------------------------------------ frame builder

export type Block = { raw: Buffer } | { rle: number; size: number } | { reservedType: true };

export interface FrameOptions {
  /** Declared window, as log2 of bytes (10…41); omitted: a single-segment frame (window = content size). */
  windowLog?: number;
  /** Declared content size; omitted: not declared (needs windowLog). */
  contentSize?: number;
  dictionaryId?: number;
  reservedBit?: boolean;
}

function blockHeader(last: boolean, type: number, size: number): Buffer {
  const h = (last ? 1 : 0) | (type << 1) | (size << 3);
  return Buffer.from([h & 0xff, (h >> 8) & 0xff, (h >> 16) & 0xff]);
}

/** One zstd frame (RFC 8878 §3.1.1) of raw / RLE blocks, no checksum. */
export function zstdFrame(blocks: Block[], options: FrameOptions = {}): Buffer {
  const single = options.windowLog === undefined;
  if (single && options.contentSize === undefined) throw new Error("a single-segment frame declares its content size");
  const fcs = options.contentSize;
  const fcsFlag = fcs === undefined ? 0 : single && fcs < 256 ? 0 : fcs >= 256 && fcs < 65536 + 256 ? 1 : fcs < 2 ** 32 ? 2 : 3;
  const dictFlag = options.dictionaryId === undefined ? 0 : 3;
  const fhd = (fcsFlag << 6) | ((single ? 1 : 0) << 5) | (options.reservedBit ? 0x08 : 0) | dictFlag;
  const parts: Buffer[] = [Buffer.from([0x28, 0xb5, 0x2f, 0xfd, fhd])];
  if (!single) parts.push(Buffer.from([(options.windowLog! - 10) << 3]));
  if (dictFlag) {
    const d = Buffer.alloc(4);
    d.writeUInt32LE(options.dictionaryId!);
    parts.push(d);
  }
  if (fcs !== undefined) {
    const bytes = [single ? 1 : 0, 2, 4, 8][fcsFlag]!;
    const b = Buffer.alloc(bytes);
    if (bytes === 1) b.writeUInt8(fcs);
    else if (bytes === 2) b.writeUInt16LE(fcs - 256);
    else if (bytes === 4) b.writeUInt32LE(fcs);
    else b.writeBigUInt64LE(BigInt(fcs));
    parts.push(b);
  }
  blocks.forEach((block, i) => {
    const last = i === blocks.length - 1;
    if ("raw" in block) parts.push(blockHeader(last, 0, block.raw.length), block.raw);
    else if ("rle" in block) parts.push(blockHeader(last, 1, block.size), Buffer.from([block.rle]));
    else parts.push(blockHeader(last, 3, 0));
  });
  return Buffer.concat(parts);
}

/** `data` as raw blocks of at most 128 KiB. */
export function zstdRaw(data: Buffer, options: FrameOptions = { contentSize: data.length }): Buffer {
  const blocks: Block[] = [];
  for (let i = 0; i < data.length || blocks.length === 0; i += 128 * 1024) blocks.push({ raw: data.subarray(i, i + 128 * 1024) });
  return zstdFrame(blocks, options);
}

/** `bytes` zero bytes as RLE blocks of 128 KiB (4 bytes each): 50 MiB in 1.6 KB. */
export function zstdZeros(bytes: number, options: FrameOptions = { windowLog: 20 }): Buffer {
  const blocks: Block[] = [];
  for (let left = bytes; left > 0; left -= 128 * 1024) blocks.push({ rle: 0, size: Math.min(left, 128 * 1024) });
  return zstdFrame(blocks, options);
}

/**
 * `data` as one frame of RLE blocks (runs of 32 bytes or more) and raw
 * blocks (the rest): a zstd compressor good enough for the tests' bodies of
 * repeated characters on Node 22.14.
 */
export function zstdRuns(data: Buffer): Buffer {
  const MAX = 128 * 1024;
  const blocks: Block[] = [];
  let raw = 0; // start of the pending raw bytes
  let i = 0;
  const flushRaw = (end: number) => {
    for (let s = raw; s < end; s += MAX) blocks.push({ raw: data.subarray(s, Math.min(end, s + MAX)) });
  };
  while (i < data.length) {
    let j = i + 1;
    while (j < data.length && data[j] === data[i] && j - i < MAX) j++;
    if (j - i >= 32) {
      flushRaw(i);
      blocks.push({ rle: data[i]!, size: j - i });
      raw = j;
    }
    i = j;
  }
  flushRaw(data.length);
  if (blocks.length === 0) blocks.push({ raw: Buffer.alloc(0) });
  return zstdFrame(blocks, { contentSize: data.length });
}

/** node:zlib's zstd compressor where this Node has one (≥ 22.15 / 23.8), else null. */
export const nativeZstdCompress: ((data: Buffer) => Buffer) | null = (() => {
  const f = (zlib as unknown as { zstdCompressSync?: (data: Buffer) => Buffer }).zstdCompressSync;
  return f ? (data: Buffer) => f(data) : null;
})();

/** Every supported coding, applied to `data`. zstd: the native compressor, or `zstdRuns` on Node 22.14. */
export function compress(coding: "gzip" | "deflate" | "deflate-raw" | "br" | "zstd", data: Buffer): Buffer {
  switch (coding) {
    case "gzip":
      return zlib.gzipSync(data);
    case "deflate":
      return zlib.deflateSync(data);
    case "deflate-raw":
      return zlib.deflateRawSync(data);
    case "br":
      return zlib.brotliCompressSync(data, { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 5 } });
    case "zstd":
      return nativeZstdCompress ? nativeZstdCompress(data) : zstdRuns(data);
  }
}
