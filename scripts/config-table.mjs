#!/usr/bin/env node
// Writes the README's configuration table from the config schema
// (configTable in src/config/index.ts, compiled to dist/ by the bootstrap).
// test/unit/config-table.test.ts fails while the README's table is stale.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { withConfigTable } = await import(path.join(ROOT, "dist", "src", "config", "index.js"));
const file = path.join(ROOT, "README.md");
fs.writeFileSync(file, withConfigTable(fs.readFileSync(file, "utf8")));
console.error("README.md: configuration table written");
