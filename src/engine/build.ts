import { readBuild, type ModelBuild, type ReadBuildOptions } from "../models/manifest.js";
import { buildPrefix, preamble, styleFromTemplate, type PromptStyle } from "../prompt/index.js";
import { TextTokenizer } from "../tokenizer/index.js";

/** What a loaded model build needs on the request path, made once at load. */
export interface LoadedBuild {
  build: ModelBuild;
  tokenizer: TextTokenizer;
  style: PromptStyle;
  terminator: number;
  /** Label text → token ids, per build: option labels are tokenized once. */
  labelCache: Map<string, number[]>;
  /**
   * Token ids every general prefix starts with (the prompt's preamble: system
   * text and worked examples), or none where the tokenizer does not keep them
   * apart from what follows. The engine computes their keys and values once.
   */
  preamble: number[];
}

export function loadBuild(dir: string, opts: ReadBuildOptions = {}): LoadedBuild {
  const build = readBuild(dir, opts);
  const tokenizer = new TextTokenizer(build);
  const style = styleFromTemplate(build.manifest.chat_template, build.manifest.calibration?.demonstrations === true, {
    special: build.manifest.special_tokens,
    bos: tokenizer.bos,
  });
  // A rendered template ends a turn with its own token (`<|eot_id|>`,
  // `<end_of_turn>`), not the eos: the first added token of its close, the
  // token read after a label to tell it from a longer one.
  const turnEnd = style.kind === "template" ? tokenizer.firstAddedId(style.chat.close) : undefined;
  const endToken = style.kind === "chatml" ? style.end : build.manifest.special_tokens.eos;
  const terminator = turnEnd ?? (endToken ? tokenizer.specialId(endToken) : undefined) ?? build.manifest.eos_token_id;
  if (terminator === undefined || terminator === null) throw new Error(`${dir}: no end-of-turn token`);
  return { build, tokenizer, style, terminator, labelCache: new Map(), preamble: preambleIds(tokenizer, style) };
}

/** The preamble's ids, where they are exactly the first ids of a general prefix (two probes: a word and a JSON state). */
export function preambleIds(tokenizer: TextTokenizer, style: PromptStyle): number[] {
  const ids = tokenizer.encode(preamble(style));
  const starts = (state: string) => {
    const p = tokenizer.encode(buildPrefix(style, state));
    return p.length > ids.length && ids.every((t, i) => p[i] === t);
  };
  return starts("x") && starts("{\"a\":1}") ? ids : [];
}

/** The most tokens one pass of `lb` may pack: ASSAY_MAX_PACKED_TOKENS (`maxPackedTokens`) within the model's context. */
export function passLimit(lb: LoadedBuild, maxPackedTokens: number): number {
  return Math.min(maxPackedTokens, lb.build.manifest.context_length);
}

/** Token ids of an answer label, tokenized once per build (bounded cache). */
export function labelIds(lb: LoadedBuild, label: string): number[] {
  let ids = lb.labelCache.get(label);
  if (!ids) {
    ids = lb.tokenizer.encode(label);
    if (lb.labelCache.size < 100_000) lb.labelCache.set(label, ids);
  }
  return ids;
}
