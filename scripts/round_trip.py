"""A GGUF build's weights written out as a float32 checkpoint folder and read back through the checkpoint path.

The checkpoint loader (decoder.py, open_checkpoint) must hand the decoder exactly the tensors the GGUF
loader hands it, and the checkpoint's tokenizer must give the GGUF tokenizer's ids: then every graph a
build writes from the checkpoint is the GGUF build's, byte for byte (the graph is a function of the
decoder's tensors: the shipped 0.5B exports to the same build hash from the refactored decoder).

    python scripts/round_trip.py --gguf .cache/weights/qwen2.5-coder-0.5b-instruct.gguf --out /tmp/ckpt [--keep]

Writes the checkpoint (transformers' save_pretrained: config.json, model.safetensors, the tokenizer), compares,
prints one JSON line, exits 1 where anything differs. Without --keep the checkpoint is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decoder import describe, layers_of, open_checkpoint, open_gguf  # noqa: E402

TEXTS = [
    "<|im_start|>system\nYou are a careful, impartial judge.<|im_end|>\n<|im_start|>user\nState:\n"
    '{"customer":"I was charged twice for order #8812, please refund one.","agent":"Refund issued."}\n\n',
    "Based on the state above, answer the question.\nQuestion: Was the customer charged twice?\nAnswer yes or no.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Ünïcödé, emoji 🙂, tabs\tand  double  spaces, 1234567 digits.",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    t0 = time.time()
    g = open_gguf(args.gguf)
    if args.out.exists():
        shutil.rmtree(args.out)
    # transformers will not save a model it read from a GGUF: its config and tensors are written as save_pretrained
    # writes a float32 checkpoint (a tied head left to the embedding table, as transformers leaves it).
    from safetensors.torch import save_file

    args.out.mkdir(parents=True)
    conf = g.hf.config
    if hasattr(conf, "quantization_config"):
        delattr(conf, "quantization_config")
    conf.save_pretrained(str(args.out))
    sd = {k: v.detach().contiguous() for k, v in g.hf.state_dict().items()}
    if getattr(conf, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    del sd
    tok_g = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    tok_g.save_pretrained(str(args.out))
    written = time.time() - t0
    c = open_checkpoint(args.out)
    spec_g, spec_c = describe(g.conf), describe(c.conf)
    same_spec = {k: v for k, v in vars(spec_g).items() if k != "ropes"} == {k: v for k, v in vars(spec_c).items() if k != "ropes"} and all(
        torch.equal(spec_g.ropes[k][0], spec_c.ropes[k][0]) for k in spec_g.ropes)
    differ = []
    tensors = 0
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        tensors += 1
        if not torch.equal(g.get(name), c.get(name)):
            differ.append(name)
    head_g = g.get("lm_head.weight")
    head_c = c.get("lm_head.weight")
    if (head_g is None) != (head_c is None) and not spec_g.tied:
        differ.append("lm_head.weight")
    for i, (lg, lc) in enumerate(zip(layers_of(g, spec_g), layers_of(c, spec_c))):
        for field in vars(lg):
            a, b = getattr(lg, field), getattr(lc, field)
            tensors += 1
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                differ.append(f"layer {i} {field}")
    tok_c = AutoTokenizer.from_pretrained(str(args.out), local_files_only=True)
    ids_differ = [t for t in TEXTS if tok_g(t, add_special_tokens=False)["input_ids"] != tok_c(t, add_special_tokens=False)["input_ids"]]
    out = {"parameters": c.n_params, "tensors_compared": tensors, "tensors_differing": differ, "same_spec": same_spec,
           "texts_tokenized_differently": len(ids_differ), "checkpoint_bytes": sum(f.stat().st_size for f in args.out.glob("*.safetensors")),
           "write_seconds": round(written, 1), "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out), flush=True)
    if not args.keep:
        shutil.rmtree(args.out)
    return 0 if not differ and same_spec and not ids_differ else 1


if __name__ == "__main__":
    sys.exit(main())
