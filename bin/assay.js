#!/usr/bin/env node
// Launcher for the compiled CLI (`npm run build` first): src/cli/index.ts.
import { runCli } from "../dist/src/cli/index.js";

process.exitCode = await runCli(process.argv);
