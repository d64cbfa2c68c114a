"""Device check: what a batch of small passes costs on one GPU, against the same passes one at a time.

For a machine with a CUDA GPU and PyTorch (no Node, no model files: the weights are random, at the
shape of a real build, since a pass's time does not depend on their values). It runs the batch graph's
module (scripts/batch_graph.py, BatchDecoder: the layout and arithmetic the batch graph is exported
from, in PyTorch on the GPU rather than onnxruntime's CUDA provider) on passes laid out as
src/inference/batch.ts lays them out (`join`), and prints per batch size the ms of one run, passes per
second, and the speed-up over running the same passes one at a time.

    python3 bench/gpu-batch.py --build 1.5b --sizes 1,8,64 --out "$OUT/gpu-batch.json"

It is a measurement of the device, not of assay's CUDA lane (which runs the s8s8 graph through
onnxruntime-node); docs/experiments/batching.md says how its figures are read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from batch_graph import BatchDecoder, join  # noqa: E402
from export_onnx import PackedDecoder, packed_example  # noqa: E402

# The shipped builds' shapes (Qwen2.5-Coder 0.5B and 1.5B Instruct).
SHAPES = {
    "0.5b": dict(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896, intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, hidden_size=1536, intermediate_size=8960, vocab_size=151936),
}


def random_state_dict(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kvd = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    r = lambda *s: torch.randn(*s, generator=gen, device="cpu") * 0.02  # noqa: E731
    sd = {"model.embed_tokens.weight": r(v, h), "model.norm.weight": torch.ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": r(h, h), p + "self_attn.q_proj.bias": r(h),
            p + "self_attn.k_proj.weight": r(kvd, h), p + "self_attn.k_proj.bias": r(kvd),
            p + "self_attn.v_proj.weight": r(kvd, h), p + "self_attn.v_proj.bias": r(kvd),
            p + "self_attn.o_proj.weight": r(h, h),
            p + "mlp.gate_proj.weight": r(f, h), p + "mlp.up_proj.weight": r(f, h), p + "mlp.down_proj.weight": r(h, f),
        }
    return sd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--sizes", default="1,8,64", help="passes per batch")
    ap.add_argument("--state-tokens", type=int, default=56, help="a small request's state (the one-line ticket's prompt)")
    ap.add_argument("--question-tokens", type=int, default=14)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda", help="cpu only to try the script itself on a machine without a GPU")
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this check is for a GPU machine", file=sys.stderr)
        return 2
    torch.set_default_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    cfg = {**SHAPES[args.build], "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0}
    gen = torch.Generator().manual_seed(0)
    model = BatchDecoder(PackedDecoder(cfg, {k: t.to(dev) for k, t in random_state_dict(cfg, gen).items()})).eval()
    vocab = cfg["vocab_size"]
    kv = np.zeros((2, cfg["num_hidden_layers"], cfg["num_key_value_heads"], 0, cfg["hidden_size"] // cfg["num_attention_heads"]), dtype=np.float32)
    rng = np.random.default_rng(0)

    def requests(n: int):
        # Each request its own state and one noul question (two presentations, as a noul question is read).
        passes = [packed_example(rng.integers(0, vocab, args.state_tokens).tolist(),
                                 [rng.integers(0, vocab, args.question_tokens).tolist() for _ in range(2)], vocab, kv) for _ in range(n)]
        return [torch.from_numpy(f) for f in join(passes, [0] * n)[0]]

    def timed(feeds) -> float:
        feeds = [t.to(dev) for t in feeds]
        with torch.no_grad():
            for _ in range(3):
                model(*feeds)
            sync()
            t = time.perf_counter()
            for _ in range(args.reps):
                model(*feeds)
            sync()
        return (time.perf_counter() - t) / args.reps * 1000

    one = timed(requests(1))
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        ms = timed(requests(n))
        rows.append({"passes": n, "ms_per_run": round(ms, 3), "passes_per_s": round(n / ms * 1000, 1), "speedup_over_one_at_a_time": round(n * one / ms, 2)})
        print(f"{n:3d} passes: {ms:8.2f} ms per run, {n / ms * 1000:8.1f} passes/s, {n * one / ms:5.2f}x one at a time", flush=True)
    result = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__, "build_shape": args.build, "state_tokens": args.state_tokens,
              "question_tokens": args.question_tokens, "one_pass_ms": round(one, 3), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
