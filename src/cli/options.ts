import { InvalidArgumentError } from "commander";

/** A commander parser for a count: an integer of at least 1, or a usage error naming the option. */
export const positiveInt = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`${name} must be a positive integer`);
  return n;
};

/** Options that are set, as optional fields: commander leaves unset ones undefined, which exactOptionalPropertyTypes does not take for "absent". */
export function defined<const T extends Record<string, unknown>>(o: T): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as { [K in keyof T]?: Exclude<T[K], undefined> };
}
