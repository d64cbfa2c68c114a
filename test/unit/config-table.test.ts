/**
 * The README's configuration table is generated from the config schema
 * (configTable in src/config/index.ts): a setting, its default and its
 * meaning are written once. `npm run docs:config` rewrites it.
 */
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT, configTable, loadConfig, withConfigTable } from "../../src/config/index.js";

describe("the README's configuration table", () => {
  it("is the one the config schema generates", () => {
    const readme = fs.readFileSync(path.join(ROOT, "README.md"), "utf8");
    expect(readme, "run npm run docs:config").toBe(withConfigTable(readme));
  });

  it("refuses a README without the markers instead of writing the table anywhere", () => {
    expect(() => withConfigTable("# a README\n")).toThrow(/config-table:start/);
  });

  it("shows a literal default the way the schema has it, and every setting has a meaning", () => {
    const table = configTable();
    expect(table).toContain("| `ASSAY_QUEUE_MAX` | `64` |");
    expect(table).toContain("| `ASSAY_REQUEST_TIMEOUT_MS` | `60000` |");
    expect(loadConfig({}).requestTimeoutMs).toBe(60_000);
    expect(table).not.toMatch(/\|\s*\|\s*$/m);
    // A boolean setting's default is shown as the value to set, and parses both ways.
    expect(table).toContain("| `ASSAY_INTRA_OP_SPINNING` | `1` |");
    expect(loadConfig({}).intraOpSpinning).toBe(true);
    expect(loadConfig({ ASSAY_INTRA_OP_SPINNING: "0" }).intraOpSpinning).toBe(false);
  });
});
