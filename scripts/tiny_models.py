"""Tiny models of every architecture the exporters write, made here from a config with random weights.

Nothing is downloaded: transformers builds each model from a small config (2 layers, hidden size 64), and
the tokenizer is trained here on a few sentences (byte-level BPE, with the chat markers of the model's
family as special tokens), so a checkpoint folder is complete as a site's would be: config.json,
model.safetensors, tokenizer.json, tokenizer_config.json and a chat template.

    python scripts/tiny_models.py --arch qwen3 --out /tmp/tiny-qwen3      # one checkpoint folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

VOCAB = 384
# Windows shorter than the check's prompts, so that a sliding layer hides keys.
WINDOW = 6

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=512, rms_norm_eps=1e-6,
              # Weights large enough that every feature moves the readings: soft caps bite, windows hide mass.
              initializer_range=0.2)

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
          "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
GEMMA = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
         "{{ raise_exception('System role not supported') }}{% endif %}"
         "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
         "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
PHI3 = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def configs() -> dict:
    """transformers config class name and its arguments, per architecture."""
    return {
        "qwen2": ("Qwen2Config", dict(COMMON, tie_word_embeddings=True)),
        "qwen3": ("Qwen3Config", dict(COMMON, head_dim=32, tie_word_embeddings=True)),
        "llama": ("LlamaConfig", dict(COMMON, tie_word_embeddings=False, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64))),
        "mistral": ("MistralConfig", dict(COMMON, sliding_window=WINDOW, tie_word_embeddings=False)),
        "gemma2": ("Gemma2Config", dict(COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                        attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                        layer_types=["sliding_attention", "full_attention"])),
        "gemma3": ("Gemma3TextConfig", dict(COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                                            layer_types=["sliding_attention", "full_attention"],
                                            rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                                                             "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0)})),
        "phi3": ("Phi3Config", dict(COMMON, sliding_window=WINDOW, partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                                    tie_word_embeddings=False)),
    }


TEMPLATES = {"qwen2": CHATML, "qwen3": CHATML, "llama": LLAMA3, "mistral": MISTRAL, "gemma2": GEMMA, "gemma3": GEMMA, "phi3": PHI3}
SPECIALS = {
    "qwen2": dict(eos="<|im_end|>", extra=["<|im_start|>", "<|endoftext|>"]),
    "qwen3": dict(eos="<|im_end|>", extra=["<|im_start|>", "<|endoftext|>", "<think>", "</think>"]),
    "llama": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", extra=["<|start_header_id|>", "<|end_header_id|>"]),
    "mistral": dict(bos="<s>", eos="</s>", extra=["[INST]", "[/INST]"]),
    "gemma2": dict(bos="<bos>", eos="<eos>", extra=["<start_of_turn>", "<end_of_turn>"]),
    "gemma3": dict(bos="<bos>", eos="<eos>", extra=["<start_of_turn>", "<end_of_turn>"]),
    "phi3": dict(eos="<|endoftext|>", extra=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
}

CORPUS = [
    "You are a careful, impartial judge. You read a state (text or JSON) and answer one question about it.",
    "Answer with exactly one of the allowed labels and nothing else.",
    "State: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "Question: Is the tower in Paris? Answer yes or no. Based on the state above, answer the question.",
    "1. safe 2. caution 3. destructive Answer with the option number only. true false Yes No",
    '{"user": "hi", "intent": "greeting", "score": 3} Please send the invoice. ls -la',
]


def tokenizer(arch: str):
    """A byte-level BPE tokenizer trained here, wrapped as transformers saves a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    sp = SPECIALS[arch]
    specials = [t for t in (sp.get("bos"), sp["eos"], *sp["extra"]) if t]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    bos = sp.get("bos")
    if bos:
        # As Llama's and Gemma's tokenizers do: a beginning-of-sequence token in front of every encoding.
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=sp["eos"],
                                   pad_token=sp["eos"], additional_special_tokens=sp["extra"])
    fast.chat_template = TEMPLATES[arch]
    return fast


def make(arch: str, seed: int = 0):
    """A tiny random model of `arch` (transformers, float32, eager attention) and its tokenizer."""
    import transformers

    cls, kw = configs()[arch]
    conf = getattr(transformers, cls)(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager", dtype=torch.float32)
    # Random norm weights, so that a norm read as w where the model means (1 + w) shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.2 + (0.0 if arch.startswith("gemma") else 1.0))
    return model.eval(), tokenizer(arch)


def save(arch: str, out: Path, seed: int = 0) -> Path:
    model, tok = make(arch, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True, choices=sorted(configs()))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    save(args.arch, args.out, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
