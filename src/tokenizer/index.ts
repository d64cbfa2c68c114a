import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";
import type { ModelBuild } from "../models/manifest.js";

/**
 * The model's own tokenizer (tokenizer.json written by the exporter). Text is
 * always encoded without added special tokens: the prompt layer writes the
 * chat template's special tokens as text and they are matched as added tokens.
 * The beginning-of-sequence token is one of them: where transformers adds it
 * by default, `bos` names it and the prompt writes it first.
 */
export class TextTokenizer {
  private readonly tok: Tokenizer;
  private readonly vocab: Map<string, number>;
  private readonly added: Map<number, string>;
  /**
   * The beginning-of-sequence token's text where transformers adds one to an
   * encoding by default (an added token), else undefined (Qwen: none).
   */
  readonly bos: string | undefined;

  constructor(build: ModelBuild) {
    const json = JSON.parse(fs.readFileSync(build.tokenizerJson, "utf8")) as {
      added_tokens?: { id: number; content: string }[];
    };
    const config = fs.existsSync(build.tokenizerConfig)
      ? (JSON.parse(fs.readFileSync(build.tokenizerConfig, "utf8")) as Record<string, unknown>)
      : {};
    this.tok = new Tokenizer(json as never, config as never);
    this.vocab = new Map((json.added_tokens ?? []).map((t) => [t.content, t.id]));
    this.added = new Map((json.added_tokens ?? []).map((t) => [t.id, t.content]));
    this.bos = this.defaultBos(config, build.manifest.special_tokens.bos);
  }

  /**
   * An explicit `add_bos_token` in tokenizer_config.json decides, as it does
   * for transformers' Llama and Gemma tokenizers (they rebuild the post
   * processor from it); without one, whatever the tokenizer.json post
   * processor puts before the text (Llama 3's `<|begin_of_text|>`).
   */
  private defaultBos(config: Record<string, unknown>, manifestBos: string | undefined): string | undefined {
    const flag = config.add_bos_token;
    if (flag === false) return undefined;
    if (flag === true) {
      const named = config.bos_token;
      const text = typeof named === "string" ? named : isContent(named) ? named.content : manifestBos;
      return text !== undefined && this.vocab.has(text) ? text : undefined;
    }
    const probe = "a";
    const plain = this.tok.encode(probe, { add_special_tokens: false }).ids;
    const full = this.tok.encode(probe, { add_special_tokens: true }).ids;
    const first = full[0];
    if (first === undefined || full.length <= plain.length || first === plain[0]) return undefined;
    return this.added.get(first);
  }

  encode(text: string): number[] {
    if (text.length === 0) return [];
    return this.tok.encode(text, { add_special_tokens: false }).ids;
  }

  /** Id of a special (added) token such as `<|im_end|>`, or undefined. */
  specialId(token: string): number | undefined {
    return this.vocab.get(token);
  }

  /** The first added token of `text` (e.g. the end of turn in a template's close), or undefined. */
  firstAddedId(text: string): number | undefined {
    return this.encode(text).find((id) => this.added.has(id));
  }

  decode(ids: number[]): string {
    return this.tok.decode(ids, { skip_special_tokens: false });
  }
}

function isContent(v: unknown): v is { content: string } {
  return typeof v === "object" && v !== null && typeof (v as { content?: unknown }).content === "string";
}
