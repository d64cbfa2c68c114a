import { readBuild, type ModelBuild, type ReadBuildOptions } from "../models/manifest.js";
import { styleFromTemplate, type PromptStyle } from "../prompt/index.js";
import { TextTokenizer } from "../tokenizer/index.js";

/** What a loaded model build needs on the request path, made once at load. */
export interface LoadedBuild {
  build: ModelBuild;
  tokenizer: TextTokenizer;
  style: PromptStyle;
  terminator: number;
  /** Label text → token ids, per build: option labels are tokenized once. */
  labelCache: Map<string, number[]>;
}

export function loadBuild(dir: string, opts: ReadBuildOptions = {}): LoadedBuild {
  const build = readBuild(dir, opts);
  const tokenizer = new TextTokenizer(build);
  const style = styleFromTemplate(build.manifest.chat_template);
  const endToken = style.kind === "chatml" ? style.end : build.manifest.special_tokens.eos;
  const terminator = (endToken ? tokenizer.specialId(endToken) : undefined) ?? build.manifest.eos_token_id;
  if (terminator === undefined || terminator === null) throw new Error(`${dir}: no end-of-turn token`);
  return { build, tokenizer, style, terminator, labelCache: new Map() };
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
