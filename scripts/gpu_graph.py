"""Write a build's GPU graph: the packed decoder with float32 products, for a GPU provider.

The CPU graphs (model.onnx and its twins, scripts/w8a8.py) multiply int8 weights by int8
activations with MatMulInteger. Neither GPU provider onnxruntime-node runs has kernels for all of
that: on WebGPU every MatMulInteger and QuantizeLinear runs on the host, with copies at every layer;
on CUDA the u8 x s8 products do. This graph is the same decoder (the inputs, outputs and tree
attention of scripts/export_onnx.py) with the GGUF's weights in float32 MatMuls, which both providers
run on the device, and its norms in the plain form (the CPU graph writes its norms out so that they
read bit for bit across CPU runtimes; a GPU sums in its own order anyway).

Why float32 and not the CPU graph's int8 arithmetic: the W8A8 readings move with the last bit of
the floats around them (docs/experiments/gpu.md). Its products rewritten as float ops read exactly
as model.onnx on the CPU provider and 0.108 away on the README's noul on WebGPU, against 0.054 for
this graph, which reads on WebGPU what it reads on the CPU provider (1e-4 in log-probability).

    model.gpu.onnx, model.gpu.onnx.data   the graph and its weights
    model.gpu.json                        what it was made from (the build hash), its weights,
                                          its key/value layout, and how far it reads from model.onnx

With --random the weights are random at a named model's real shapes and no GGUF is read: the
device check (bench/gpu-check.sh) builds its graphs that way on a machine that has no weights, with
their CPU graph (model.onnx, W8A8) beside them for its CPU column.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).parent))
from decoder import INPUTS, OUTPUTS, PackedDecoder, Spec, Weights, describe, open_weights  # noqa: E402
from export_onnx import example_inputs, no_past, packed_example, sess_run  # noqa: E402
from fetch_weights import sha256 as sha256_file  # noqa: E402

# What this script writes: the engine refuses a GPU graph of another format, and bootstrap writes it again.
GPU_FORMAT = "assay-gpu-v1"
GPU_GRAPH = "model.gpu.onnx"

# The shapes of the shipped builds, for --random (Qwen2.5-Coder's config.json).
SHAPES = {
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, vocab_size=151936),
}


def log(msg: str) -> None:
    print(f"[gpu-graph] {msg}", flush=True)


class GpuDecoder(PackedDecoder):
    """PackedDecoder with float32 tables and the norm onnxruntime fuses.

    The CPU graph keeps its embedding table in fp16 (a Gather reads a few rows);
    a WebGPU adapter without shader-f16 has no fp16 kernels at all, and a
    Gather left on the host would copy every pass's rows over: float32 here.
    """

    def __init__(self, spec: Spec, w: Weights):
        super().__init__(spec, w, embed_dtype=torch.float32)

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w


def random_weights(name: str) -> Weights:
    s = SHAPES[name]
    H, I, V, L = s["hidden_size"], s["intermediate_size"], s["vocab_size"], s["num_hidden_layers"]
    heads, kv = s["num_attention_heads"], s["num_key_value_heads"]
    D = H // heads
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": torch.ones(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.ones(H)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(H)
        for n, out in (("q", heads * D), ("k", kv * D), ("v", kv * D), ("o", H)):
            sd[p + f"self_attn.{n}_proj.weight"] = r(out, H)
            if n != "o":
                sd[p + f"self_attn.{n}_proj.bias"] = r(out)
        sd[p + "mlp.gate_proj.weight"] = r(I, H)
        sd[p + "mlp.up_proj.weight"] = r(I, H)
        sd[p + "mlp.down_proj.weight"] = r(H, I)
    from transformers import Qwen2Config

    conf = Qwen2Config(num_hidden_layers=L, num_attention_heads=heads, num_key_value_heads=kv, hidden_size=H, intermediate_size=I,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, vocab_size=V, tie_word_embeddings=True)
    return Weights(conf=conf, get=sd.get, n_params=int(sum(t.numel() for t in sd.values())), source=f"random {name}")


def export(holder: list[PackedDecoder], vocab: int, path: Path, w8a8: bool = False) -> None:
    """Export holder's one module to `path` (one weights file beside it), W8A8-rewritten where asked; empties holder."""
    model = holder.pop()
    tmp = path.parent / "gpu-export.partial"
    tmp.mkdir(exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            example_inputs(49, 24, 3, vocab, no_past(model, 5)),
            str(tmp / "model.onnx"),
            input_names=INPUTS,
            output_names=OUTPUTS,
            dynamic_axes={
                "input_ids": {0: "T"}, "position_ids": {0: "T"}, "subtree_end": {0: "T"},
                "gather_idx": {0: "N"}, "target_ids": {0: "N", 1: "K"},
                "branch_slots": {0: "B", 1: "L"}, "slot_of": {0: "R"}, "past_kv": {3: "P"},
                "logprobs": {0: "N", 1: "K"}, "present_kv": {3: "PS"},
            },
            opset_version=17,
            dynamo=False,
            external_data=True,
        )
    del model
    gc.collect()
    m = onnx.load(str(tmp / "model.onnx"), load_external_data=True)
    if w8a8:
        from w8a8 import rewrite

        m, _ = rewrite(m)
    # One weights file beside the graph, as the CPU graphs have (torch writes one per tensor).
    save(m, path)
    shutil.rmtree(tmp)


def save(m: onnx.ModelProto, path: Path) -> None:
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def check(path: Path, reference: Path, vocab: int, kv: dict) -> float:
    """Max |dlogprob| between two graphs on one packed request of random tokens (the onnxruntime CPU provider)."""
    g = torch.Generator().manual_seed(1)
    state = torch.randint(0, vocab, (40,), generator=g).tolist()
    branches = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 9, 5)]
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    ex = packed_example(state, branches, vocab, empty)
    return float(np.abs(sess_run(path, INPUTS, ex) - sess_run(reference, INPUTS, ex)).max())


def main() -> int:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="the build's weights (its recipe's GGUF)")
    src.add_argument("--from", dest="checkpoint", type=Path, help="the build's weights: a checkpoint folder or a GGUF file")
    src.add_argument("--random", choices=sorted(SHAPES), help="random weights at this model's shapes, and their CPU graph")
    ap.add_argument("--build", type=Path, required=True, help="the build's folder (model.gpu.* written; its model.onnx compared)")
    args = ap.parse_args()

    t0 = time.time()
    out: Path = args.build
    out.mkdir(parents=True, exist_ok=True)
    path = out / GPU_GRAPH
    logging.disable(logging.INFO)
    if args.random:
        log(f"random weights at {args.random}'s shapes")
        w = random_weights(args.random)
        build_hash = None
    else:
        build_hash = json.loads((out / "manifest.json").read_text())["build_hash"]
        source = args.gguf or args.checkpoint
        log(f"reading weights from {source.name} (to float32) ...")
        w = open_weights(source)
        w.hf = None  # only the tensors are read: transformers' model goes with the last reference to it
    spec = describe(w.conf)
    vocab = spec.vocab
    if args.random:
        log(f"exporting their CPU graph (W8A8, model.onnx) ... {time.time() - t0:.0f}s")
        export([PackedDecoder(spec, w).eval()], vocab, out / "model.onnx", w8a8=True)
    kv = {"layers": spec.layers, "kv_heads": spec.kv_heads, "head_dim": spec.head_dim}
    log(f"exporting {path} ... {time.time() - t0:.0f}s")
    # Built in the call, so that export() holds its only reference and frees it before it re-reads the
    # graph: the 1.5B's float32 weights would otherwise be in memory twice over (torch, then onnx).
    holder = [GpuDecoder(spec, w).eval()]
    del w
    export(holder, vocab, path)

    try:
        diff = check(path, out / "model.onnx", vocab, kv)
        # The quantization's error, on random tokens (the export logs the same of model.onnx against float32).
        log(f"{path.name} vs model.onnx (onnxruntime CPU provider): max |dlogprob| = {diff:.3f}")
    except ImportError:
        # A GPU machine's Python may lack onnxruntime: the device check times the graphs from Node only.
        log("onnxruntime is not installed here: the graph is not compared with model.onnx")
        diff = None
    facts = {
        "format": GPU_FORMAT,
        "build_hash": build_hash,
        "weights": "float32",
        "products": "MatMul",
        "file": path.name,
        "kv": kv,
        "sha256": sha256_file(path)[:16],
        "max_abs_logprob_vs_model_onnx": None if diff is None else round(diff, 4),
    }
    (out / "model.gpu.json").write_text(json.dumps(facts, indent=2) + "\n")
    log(f"wrote {out}/model.gpu.json in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
