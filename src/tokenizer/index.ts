import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";
import type { ModelBuild } from "../models/manifest.js";

/**
 * The model's own tokenizer (tokenizer.json written by the exporter). Text is
 * always encoded without added special tokens: the prompt layer writes the
 * chat template's special tokens as text and they are matched as added tokens.
 */
export class TextTokenizer {
  private readonly tok: Tokenizer;
  private readonly vocab: Map<string, number>;

  constructor(build: ModelBuild) {
    const json = JSON.parse(fs.readFileSync(build.tokenizerJson, "utf8")) as {
      added_tokens?: { id: number; content: string }[];
    };
    const config = fs.existsSync(build.tokenizerConfig)
      ? (JSON.parse(fs.readFileSync(build.tokenizerConfig, "utf8")) as Record<string, unknown>)
      : {};
    this.tok = new Tokenizer(json as never, config as never);
    this.vocab = new Map((json.added_tokens ?? []).map((t) => [t.content, t.id]));
  }

  encode(text: string): number[] {
    if (text.length === 0) return [];
    return this.tok.encode(text, { add_special_tokens: false }).ids;
  }

  /** Id of a special (added) token such as `<|im_end|>`, or undefined. */
  specialId(token: string): number | undefined {
    return this.vocab.get(token);
  }

  decode(ids: number[]): string {
    return this.tok.decode(ids, { skip_special_tokens: false });
  }
}
