/**
 * vitest.config.ts, run under another Node line by .ci/node-lts.mjs: the one
 * difference is `better-sqlite3`, resolved to the build made for that Node's
 * ABI (ASSAY_NODE_LTS_SQLITE) instead of the project's own, made for the Node
 * that ran `npm install`.
 */
import { defineConfig, mergeConfig } from "vitest/config";
import base from "../vitest.config.js";

const sqlite = process.env.ASSAY_NODE_LTS_SQLITE;
if (!sqlite) throw new Error("ASSAY_NODE_LTS_SQLITE is not set: run this config through .ci/node-lts.mjs");

export default mergeConfig(base, defineConfig({ resolve: { alias: { "better-sqlite3": sqlite } } }));
