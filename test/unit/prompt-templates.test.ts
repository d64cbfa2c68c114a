import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { afterAll, describe, expect, it, vi } from "vitest";
import {
  buildPrefix,
  buildPrompt,
  closeTurn,
  DEFAULT_DEBIAS,
  label,
  preamble,
  styleFromTemplate,
  SYSTEM,
  type PromptStyle,
} from "../../src/prompt/index.js";
import { codesearchItem, codesearchPrefix, factcheckClaim, factcheckPrefixParts } from "../../src/prompt/families.js";
import { ChatTemplate, PINNED_DATE, pinnedStrftime } from "../../src/prompt/template.js";
import { askAfter, askBefore } from "../../src/eval/study.js";
import type { EvalItem } from "../../src/eval/datasets.js";
import { loadBuild } from "../../src/engine/build.js";
import { TextTokenizer } from "../../src/tokenizer/index.js";
import type { Manifest, ModelBuild } from "../../src/models/manifest.js";
import type { Question } from "../../src/validate/schema.js";

/**
 * A build's own chat template renders its prompts. The Qwen2.5 template is
 * the shipped builds' own (taken from their GGUF); the others are written in
 * the style of the Qwen3, Llama 3.1, Gemma and Gemma 2 templates.
 */

const FIXTURES = path.resolve(import.meta.dirname, "..", "fixtures", "chat-templates");
const fixture = (name: string) => fs.readFileSync(path.join(FIXTURES, `${name}.jinja`), "utf8");

const CHATML: PromptStyle = { kind: "chatml", end: "<|im_end|>" };
const GEMMA_TOKENS = { bos: "<bos>", eos: "<eos>", pad: "<pad>" };
const LLAMA_TOKENS = { bos: "<|begin_of_text|>", eos: "<|eot_id|>" };

const CODESEARCH_SYSTEM = "You are an expert software engineer triaging a bug report.";
const FACTCHECK_SYSTEM =
  "You are a careful fact checker. You read a document and decide whether a claim is fully supported by it. " +
  "A claim is supported only if everything it states can be found in or directly inferred from the document. " +
  "Answer with exactly yes or no.";

const QUESTIONS: Record<string, Question> = {
  late: { type: "noul", instructions: "Was the delivery late?" },
  polite: { type: "noul", instructions: "The reply is polite." },
  topic: { type: "choice", criteria: { billing: "money matters", shipping: null, other: null } },
  tone: { type: "score", criteria: ["hostile", "neutral", "warm"] },
  levels: { type: "score", criteria: ["the reply ignores the question entirely", "the reply answers it in full"] },
};
const STATE = { order: 17, note: "arrived two days after the promised date" };

/** Every suffix of a prompt: each question's first presentation, its variants and its billed form. */
function suffixes(p: ReturnType<typeof buildPrompt>): string[] {
  return p.questions.flatMap((q) => [q.suffix, ...(q.variants ?? []), ...(q.billedSuffix !== undefined ? [q.billedSuffix] : [])]);
}

function templateStyle(name: string, special: Record<string, string>): Extract<PromptStyle, { kind: "template" }> {
  const style = styleFromTemplate(fixture(name), false, { special });
  if (style.kind !== "template") throw new Error(`${name}: not the template kind`);
  return style;
}

/** The template's own rendering of one exchange, as transformers' apply_chat_template writes it (date pinned). */
function renderWhole(name: string, special: Record<string, string>, system: string, user: string, fold = false): string {
  const tokens = Object.fromEntries(Object.entries(special).map(([k, v]) => [`${k}_token`, v]));
  const messages = fold ? [{ role: "user", content: `${system}\n\n${user}` }] : [{ role: "system", content: system }, { role: "user", content: user }];
  return new Template(fixture(name)).render({ ...tokens, messages, add_generation_prompt: true, enable_thinking: false, date_string: PINNED_DATE });
}

describe("the shipped Qwen2.5 template", () => {
  const source = fixture("qwen2.5");

  it("renders exactly ChatML, so the build keeps the chatml kind", () => {
    expect(styleFromTemplate(source)).toEqual(CHATML);
    expect(styleFromTemplate(source, true)).toEqual({ ...CHATML, demonstrations: true });
    const chat = ChatTemplate.compile(source, { eos: "<|im_end|>", pad: "<|endoftext|>" }, [SYSTEM, CODESEARCH_SYSTEM])!;
    expect(chat.pieces(SYSTEM)).toEqual({ open: `<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\n`, close: "<|im_end|>\n<|im_start|>assistant\n" });
    expect(chat.pieces(CODESEARCH_SYSTEM).open).toBe(`<|im_start|>system\n${CODESEARCH_SYSTEM}<|im_end|>\n<|im_start|>user\n`);
  });

  it("gives byte-identical prompts: a general request, worked examples, fact check and code search", () => {
    const style = styleFromTemplate(source, false, { special: { eos: "<|im_end|>", pad: "<|endoftext|>" } });
    expect(buildPrompt(style, STATE, QUESTIONS, DEFAULT_DEBIAS)).toEqual(buildPrompt(CHATML, STATE, QUESTIONS, DEFAULT_DEBIAS));
    expect(buildPrefix(style, "S")).toBe(`<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\nState:\nS\n\n`);
    const examples = styleFromTemplate(source, true);
    expect(preamble(examples)).toBe(preamble({ ...CHATML, demonstrations: true }));

    expect(factcheckPrefixParts(style)).toEqual({ head: `<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\nState:\n`, tail: "\n\n" });
    expect(factcheckClaim(style, "It rained.")).toBe(factcheckClaim(CHATML, "It rained."));
    expect(factcheckClaim(style, "It rained.").endsWith("Answer yes or no.<|im_end|>\n<|im_start|>assistant\n")).toBe(true);

    expect(codesearchPrefix(style, "Crash on save")).toBe(
      `<|im_start|>system\n${CODESEARCH_SYSTEM}<|im_end|>\n<|im_start|>user\nBug report:\nCrash on save\n\n`,
    );
    const item = { id: "1", path: "src/save.ts", kind: "file" };
    expect(codesearchItem(style, item)).toBe("File: `src/save.ts`\nTo fix this bug, would you need to look at this file? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n");
  });

  it("gives the readout study its prompts as before", () => {
    const style = styleFromTemplate(source);
    const claim: EvalItem = { id: "c", type: "noul", state: "The sky was grey.", question: { type: "noul", instructions: "The document supports this claim: It rained." }, gold: false };
    expect(askBefore(style, claim)!.prefix).toBe(`<|im_start|>system\n${FACTCHECK_SYSTEM}<|im_end|>\n<|im_start|>user\nDocument:\nThe sky was grey.\n\n`);
    const q: EvalItem = { id: "q", type: "noul", state: "S", question: { type: "noul", instructions: "Is it?" }, gold: true };
    expect(askBefore(style, q)!.prefix).toBe(`<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\nQuestion: Is it?\n\nState:\nS\n\n`);
    expect(askAfter(style, q)).toEqual(askAfter(CHATML, q));
  });
});

describe("templates other than ChatML", () => {
  it("Qwen3: ChatML turns, and the generation prompt closes an empty think block", () => {
    const style = templateStyle("qwen3", { eos: "<|im_end|>", pad: "<|endoftext|>" });
    expect(style.chat.close).toBe("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    // The opening is ChatML's: the general prefix is what a Qwen2.5 build writes.
    expect(buildPrefix(style, "S")).toBe(buildPrefix(CHATML, "S"));
    const p = buildPrompt(style, "S", { q: { type: "noul", instructions: "Is it?" } });
    expect(p.questions[0]!.suffix.endsWith("Answer yes or no.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")).toBe(true);
    // The answer starts right after the generation prompt: no leading space.
    expect(p.questions[0]!.labels).toEqual(["yes", "Yes", "no", "No"]);
    expect(label(style, "2")).toBe("2");
  });

  it("Llama 3.1: header turns, the bos the template writes, and the date pinned whatever the clock", () => {
    vi.useFakeTimers();
    try {
      vi.setSystemTime(new Date("2031-02-03T04:05:06Z"));
      const a = templateStyle("llama3.1", LLAMA_TOKENS);
      const early = buildPrompt(a, "S", QUESTIONS, DEFAULT_DEBIAS);
      vi.setSystemTime(new Date("2019-11-30T23:59:59Z"));
      const b = templateStyle("llama3.1", LLAMA_TOKENS);
      expect(buildPrompt(b, "S", QUESTIONS, DEFAULT_DEBIAS)).toEqual(early);
      expect(early.prefix).toBe(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
          `Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n${SYSTEM}<|eot_id|>` +
          "<|start_header_id|>user<|end_header_id|>\n\nState:\nS\n\n",
      );
      expect(a.chat.close).toBe("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    } finally {
      vi.useRealTimers();
    }
  });

  it("a template that reads the clock itself (strftime_now) gets the pinned date", () => {
    const source =
      "{{ bos_token }}Today is {{ strftime_now('%A, %d %B %Y (%-d/%-m/%y)') }}.\n" +
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    vi.useFakeTimers();
    try {
      vi.setSystemTime(new Date("2030-05-06T07:08:09Z"));
      const chat = ChatTemplate.compile(source, { bos: "<s>" }, [SYSTEM, "other"])!;
      expect(chat.pieces(SYSTEM).open).toBe(`<s>Today is Friday, 26 July 2024 (26/7/24).\n<system>${SYSTEM}</system><user>`);
      expect(chat.close).toBe("</user><assistant>");
    } finally {
      vi.useRealTimers();
    }
    expect(pinnedStrftime("%d %b %Y")).toBe(PINNED_DATE);
    expect(pinnedStrftime("%Y-%m-%d %H:%M %j %% %Q")).toBe("2024-07-26 00:00 208 % %Q");
  });

  it("Gemma: the system text opens the first user turn", () => {
    const style = templateStyle("gemma", GEMMA_TOKENS);
    expect(style.chat.foldsSystem).toBe(false); // the template folds it itself
    expect(buildPrefix(style, "S")).toBe(`<bos><start_of_turn>user\n${SYSTEM}\n\nState:\nS\n\n`);
    expect(closeTurn(style, "Q")).toBe("Q<end_of_turn>\n<start_of_turn>model\n");
  });

  it("Gemma 2: a template that raises on a system turn gets the system text folded into the user turn", () => {
    const source = fixture("gemma2");
    expect(() => new Template(source).render({ messages: [{ role: "system", content: "x" }, { role: "user", content: "y" }], bos_token: "<bos>" })).toThrow(
      /System role not supported/,
    );
    const style = templateStyle("gemma2", GEMMA_TOKENS);
    expect(style.chat.foldsSystem).toBe(true);
    expect(buildPrefix(style, "S")).toBe(`<bos><start_of_turn>user\n${SYSTEM}\n\nState:\nS\n\n`);
    expect(codesearchPrefix(style, "Crash")).toBe(`<bos><start_of_turn>user\n${CODESEARCH_SYSTEM}\n\nBug report:\nCrash\n\n`);
    // The same prompts as the Gemma template that folds the system text itself.
    const gemma = templateStyle("gemma", GEMMA_TOKENS);
    expect(buildPrompt(style, STATE, QUESTIONS, DEFAULT_DEBIAS)).toEqual(buildPrompt(gemma, STATE, QUESTIONS, DEFAULT_DEBIAS));
  });

  it("ignores worked examples: they were fitted on ChatML builds only", () => {
    const style = styleFromTemplate(fixture("llama3.1"), true, { special: LLAMA_TOKENS });
    expect(style.demonstrations).toBeUndefined();
    expect(buildPrefix(style, "S")).toBe(buildPrefix(templateStyle("llama3.1", LLAMA_TOKENS), "S"));
  });

  it("a template that marks no turn, or does not render, keeps the rule from before", () => {
    expect(styleFromTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", false, { special: GEMMA_TOKENS })).toEqual({ kind: "completion" });
    expect(styleFromTemplate("{% for m in messages %}{{ m.content ")).toEqual({ kind: "completion" });
    expect(styleFromTemplate("{{ raise_exception('no') }}<|im_start|>")).toEqual(CHATML);
  });
});

describe("every question of a request shares one byte-identical prefix", () => {
  const cases: [string, Record<string, string>, boolean][] = [
    ["qwen2.5", { eos: "<|im_end|>" }, false],
    ["qwen3", { eos: "<|im_end|>" }, false],
    ["llama3.1", LLAMA_TOKENS, false],
    ["gemma", GEMMA_TOKENS, false],
    ["gemma2", GEMMA_TOKENS, true],
  ];

  it.each(cases)("%s: prefix + each suffix is the template's own rendering of that question", (name, special, fold) => {
    const style = styleFromTemplate(fixture(name), false, { special });
    const p = buildPrompt(style, STATE, QUESTIONS, DEFAULT_DEBIAS);
    const close = style.kind === "template" ? style.chat.close : "<|im_end|>\n<|im_start|>assistant\n";
    const open = renderWhole(name, special, SYSTEM, "X", fold).split("X")[0]!;
    expect(p.prefix.startsWith(open)).toBe(true);
    const body = p.prefix.slice(open.length);
    const all = suffixes(p);
    expect(all.length).toBeGreaterThan(Object.keys(QUESTIONS).length);
    for (const suffix of all) {
      expect(suffix.endsWith(close)).toBe(true);
      const text = suffix.slice(0, suffix.length - close.length);
      expect(p.prefix + suffix).toBe(renderWhole(name, special, SYSTEM, body + text, fold));
    }
    // Another request on the same state, other questions: the same prefix, byte for byte.
    expect(buildPrompt(style, STATE, { only: QUESTIONS.tone! }, DEFAULT_DEBIAS).prefix).toBe(p.prefix);
  });

  it("fact check and code search prefixes are the template's rendering under their own system texts", () => {
    const style = templateStyle("llama3.1", LLAMA_TOKENS);
    const query = codesearchPrefix(style, "Crash on save");
    const item = codesearchItem(style, { id: "1", path: "a.ts", kind: "file" });
    const text = item.slice(0, item.length - style.chat.close.length);
    expect(query + item).toBe(renderWhole("llama3.1", LLAMA_TOKENS, CODESEARCH_SYSTEM, `Bug report:\nCrash on save\n\n${text}`));
    expect(style.chat.pieces(CODESEARCH_SYSTEM)).toBe(style.chat.pieces(CODESEARCH_SYSTEM)); // rendered once
    const { head, tail } = factcheckPrefixParts(style);
    expect(head).toBe(`${preamble(style)}State:\n`);
    expect(`${head}Doc${tail}`).toBe(buildPrefix(style, "Doc"));
  });
});

// ---- builds: bos and the end-of-turn token ----------------------------------

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "assay-prompt-templates-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

const CHARS = ["\n", ...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i))];

/**
 * A tokenizer.json of one token per character plus `added` tokens (ids after
 * the characters'), and, with `bosProcessor`, a post processor that puts that
 * token first, as Llama 3's and Gemma's do.
 */
function tokenizerJson(added: string[], bosProcessor?: string): object {
  const vocab = Object.fromEntries(CHARS.map((c, i) => [c, i]));
  const ids = new Map(added.map((t, i) => [t, CHARS.length + i]));
  const a = { Sequence: { id: "A", type_id: 0 } };
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added.map((content) => ({ id: ids.get(content), content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
    normalizer: null,
    pre_tokenizer: null,
    post_processor: bosProcessor
      ? {
          type: "TemplateProcessing",
          single: [{ SpecialToken: { id: bosProcessor, type_id: 0 } }, a],
          pair: [{ SpecialToken: { id: bosProcessor, type_id: 0 } }, a, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { [bosProcessor]: { id: bosProcessor, ids: [ids.get(bosProcessor)], tokens: [bosProcessor] } },
        }
      : null,
    decoder: null,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges: [] },
  };
}

function manifest(chatTemplate: string | null, special: Record<string, string>, eosId: number | null): Manifest {
  return {
    format: "assay-packed-v4",
    architecture: "test",
    name: "test",
    vocab_size: 1000,
    context_length: 4096,
    hidden_size: 8,
    num_layers: 1,
    parameters: 1,
    quantization: {},
    chat_template: chatTemplate,
    special_tokens: special,
    eos_token_id: eosId,
    source: {},
    build_hash: "0000000000000000",
    calibration: null,
  };
}

let builds = 0;
/** A build folder holding a manifest and tokenizer files (no graph: loadBuild does not open it). */
function writeBuild(opts: { template: string | null; special: Record<string, string>; added: string[]; bosProcessor?: string; config?: object }): string {
  const dir = path.join(tmp, `build-${builds++}`);
  fs.mkdirSync(dir);
  const eos = opts.special.eos;
  const eosId = eos !== undefined ? CHARS.length + opts.added.indexOf(eos) : null;
  fs.writeFileSync(path.join(dir, "manifest.json"), JSON.stringify(manifest(opts.template, opts.special, eosId)));
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson(opts.added, opts.bosProcessor)));
  if (opts.config) fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(opts.config));
  return dir;
}

const load = (dir: string) => loadBuild(dir, { calibration: () => null, calibrationDir: tmp });
const QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"];
const LLAMA_ADDED = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
const GEMMA_ADDED = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"];

describe("loaded builds", () => {
  it("the Qwen2.5 build: ChatML, <|im_end|> ends the turn, no bos", () => {
    const lb = load(writeBuild({ template: fixture("qwen2.5"), special: { eos: "<|im_end|>", pad: "<|endoftext|>" }, added: QWEN_ADDED, config: { bos_token: null } }));
    expect(lb.style).toEqual(CHATML);
    expect(lb.tokenizer.bos).toBeUndefined();
    expect(lb.terminator).toBe(lb.tokenizer.specialId("<|im_end|>"));
  });

  it("Qwen3: the terminator is the close's first special token, not a think tag", () => {
    const lb = load(writeBuild({ template: fixture("qwen3"), special: { eos: "<|endoftext|>" }, added: QWEN_ADDED }));
    expect(lb.style.kind).toBe("template");
    expect(lb.terminator).toBe(lb.tokenizer.specialId("<|im_end|>"));
    expect(lb.terminator).not.toBe(lb.build.manifest.eos_token_id);
  });

  it("Llama 3.1: <|eot_id|> ends the turn; the template writes the bos the post processor would add, once", () => {
    const lb = load(writeBuild({ template: fixture("llama3.1"), special: { bos: "<|begin_of_text|>", eos: "<|end_of_text|>" }, added: LLAMA_ADDED, bosProcessor: "<|begin_of_text|>" }));
    expect(lb.tokenizer.bos).toBe("<|begin_of_text|>");
    expect(lb.style.bos).toBeUndefined();
    expect(lb.terminator).toBe(lb.tokenizer.specialId("<|eot_id|>"));
    const ids = lb.tokenizer.encode(buildPrefix(lb.style, "S"));
    expect(ids[0]).toBe(lb.tokenizer.specialId("<|begin_of_text|>"));
    expect(ids.filter((t) => t === ids[0]).length).toBe(1);
    expect(lb.preamble).toEqual(lb.tokenizer.encode(preamble(lb.style)));
  });

  it("Gemma 2: <end_of_turn> ends the turn, the system text folded", () => {
    const lb = load(writeBuild({ template: fixture("gemma2"), special: GEMMA_TOKENS, added: GEMMA_ADDED, bosProcessor: "<bos>", config: { add_bos_token: true, bos_token: "<bos>" } }));
    expect(lb.terminator).toBe(lb.tokenizer.specialId("<end_of_turn>"));
    expect(buildPrefix(lb.style, "S").startsWith(`<bos><start_of_turn>user\n${SYSTEM}\n\n`)).toBe(true);
  });

  it("a template without its own bos gets the one the tokenizer adds by default", () => {
    const source = "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
    const lb = load(writeBuild({ template: source, special: GEMMA_TOKENS, added: GEMMA_ADDED, config: { add_bos_token: true, bos_token: { content: "<bos>" } } }));
    expect(lb.style.bos).toBe("<bos>");
    const prefix = buildPrefix(lb.style, "S");
    expect(prefix).toBe(`<bos><start_of_turn>system\n${SYSTEM}<end_of_turn>\n<start_of_turn>user\nState:\nS\n\n`);
    expect(lb.tokenizer.encode(prefix)[0]).toBe(lb.tokenizer.specialId("<bos>"));
    expect(codesearchPrefix(lb.style, "q").startsWith("<bos><start_of_turn>system\n")).toBe(true);
  });

  it("a base model (no template) whose tokenizer adds a bos: the completion prompt starts with it; eos ends the answer", () => {
    const lb = load(writeBuild({ template: null, special: GEMMA_TOKENS, added: GEMMA_ADDED, bosProcessor: "<bos>" }));
    expect(lb.style).toEqual({ kind: "completion", bos: "<bos>" });
    expect(buildPrefix(lb.style, "S")).toBe(`<bos>${SYSTEM}\n\nState:\nS\n\n`);
    expect(lb.terminator).toBe(lb.tokenizer.specialId("<eos>"));
    expect(lb.preamble[0]).toBe(lb.tokenizer.specialId("<bos>"));
  });

  it("an explicit add_bos_token: false wins over the post processor, as in transformers' Llama tokenizers", () => {
    const dir = writeBuild({ template: null, special: GEMMA_TOKENS, added: GEMMA_ADDED, bosProcessor: "<bos>", config: { add_bos_token: false } });
    const build: ModelBuild = { dir, manifest: manifest(null, GEMMA_TOKENS, null), onnxPath: "", tokenizerJson: path.join(dir, "tokenizer.json"), tokenizerConfig: path.join(dir, "tokenizer_config.json") };
    expect(new TextTokenizer(build).bos).toBeUndefined();
    expect(load(dir).style).toEqual({ kind: "completion" });
  });
});
