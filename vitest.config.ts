import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Engine tests run the real model on 2 cores: one file at a time keeps
    // them from fighting over the cores and memory.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 180_000,
    reporters: ["default"],
  },
});
