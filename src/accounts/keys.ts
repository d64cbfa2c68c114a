/**
 * API key format and hashing. A key is `sk-assay-` followed by 43 base64url
 * characters (32 random bytes). Only its SHA-256 (hex) and a short display
 * prefix are ever stored, so a leaked database leaks no usable key.
 */
import crypto from "node:crypto";

export const KEY_PREFIX = "sk-assay-";
const KEY_RANDOM_BYTES = 32;
/** 32 bytes in unpadded base64url are 43 characters. */
export const KEY_PATTERN = /^sk-assay-[A-Za-z0-9_-]{43}$/;
/** Characters of the key kept for display: the fixed prefix plus 4 random ones (24 of 256 bits). */
const DISPLAY_CHARS = KEY_PREFIX.length + 4;

export function generateKey(): string {
  return KEY_PREFIX + crypto.randomBytes(KEY_RANDOM_BYTES).toString("base64url");
}

export function isWellFormedKey(key: string): boolean {
  return KEY_PATTERN.test(key);
}

/** SHA-256 of the key, lower-case hex. A fast hash is enough: the key carries 256 random bits. */
export function hashKey(key: string): string {
  return crypto.createHash("sha256").update(key, "utf8").digest("hex");
}

export function displayPrefix(key: string): string {
  return key.slice(0, DISPLAY_CHARS);
}

/**
 * Constant-time comparison of two hex hashes. The database lookup by hash
 * is an index probe whose timing could in principle leak; this final check
 * is the one that decides.
 */
export function hashesEqual(aHex: string, bHex: string): boolean {
  const a = Buffer.from(aHex, "hex");
  const b = Buffer.from(bHex, "hex");
  if (a.length !== b.length || a.length === 0) return false;
  return crypto.timingSafeEqual(a, b);
}
