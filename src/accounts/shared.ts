/** Rules both stores share: organization names, hold ids, the starting grant. */
import crypto from "node:crypto";
import { assertMicro } from "./money.js";

const ORG_NAME_MAX = 100;
/** Default free credit for a new organization: $1. */
export const DEFAULT_STARTING_GRANT_MICRO = 1_000_000;

export interface StoreOptions {
  /** µUSD granted to every new organization (0 = none). */
  startingGrantMicro?: number;
}

/** The starting grant a store is opened with, checked. */
export function startingGrant(options: StoreOptions): number {
  const grant = options.startingGrantMicro ?? DEFAULT_STARTING_GRANT_MICRO;
  assertMicro(grant, "starting grant");
  return grant;
}

/** Trimmed organization name, or an Error saying what is wrong with it. */
export function checkOrgName(name: string): string {
  const n = name.trim();
  if (n.length === 0) throw new Error("organization name must not be empty");
  if (n.length > ORG_NAME_MAX) throw new Error(`organization name must be at most ${ORG_NAME_MAX} characters`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(n)) throw new Error("organization name must not contain control characters");
  return n;
}

export const newHoldId = (): string => `hold_${crypto.randomUUID()}`;
