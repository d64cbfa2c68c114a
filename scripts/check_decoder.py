"""Checks the shared decoder (decoder.py) against transformers on a tiny random model of each architecture.

For each architecture (tiny_models.py: 2 layers, hidden size 64, sliding windows of 6 tokens where the
architecture has them, prompts of 20+ tokens so the window hides keys), the label log-probabilities of a
packed multi-question pass must equal transformers' own forward (eager attention, float32) on each
question alone, within 1e-4:

    packed     the decoder in torch, every question in one packed pass
    continued  the same pass continuing the keys and values of an earlier pass over the state's start
    onnx       the float32 ONNX graph of the decoder, run by onnxruntime's CPU provider
    batch      the batch graph's layout (batch_graph.py), three passes in one run
    half       the half-precision GPU graph (half_graph.py; attention fused where the model's is plain), within 1e-2

The model is read as a site's would be: saved by transformers as a checkpoint folder and opened by the
decoder's checkpoint loader. Prints one JSON line per architecture; exits 1 where any reading is off.

    python scripts/check_decoder.py [--arch qwen3 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import tiny_models  # noqa: E402
from export_onnx import packed_example  # noqa: E402
from decoder import INPUTS, OUTPUTS, PackedDecoder, describe, open_checkpoint, open_gguf  # noqa: E402

TOLERANCE = 1e-4
# The half-precision graph against float32: issue 74 measured 0.008 in log-probability (torch, float16, the 0.5B and 1.5B).
HALF_TOLERANCE = 1e-2


def packed(prefix: list[int], branches: list[list[int]], targets: torch.Tensor, past: torch.Tensor):
    """export_onnx.py's packed layout (packed_example), reading `targets` and continuing the tensor `past`."""
    ex = packed_example(prefix, branches, 1, past.numpy())
    return (*ex[:4], targets, ex[5], ex[6], past)


def reference(hf, prefix: list[int], branches: list[list[int]], targets: torch.Tensor) -> torch.Tensor:
    rows = []
    with torch.no_grad():
        for b, branch in enumerate(branches):
            logits = hf(torch.tensor([prefix + branch])).logits[0, -1]
            rows.append(torch.log_softmax(logits.float(), -1)[targets[b]])
    return torch.stack(rows)


def check(arch: str, work: Path, gguf: Path | None = None, tolerance: float = TOLERANCE, half_tolerance: float = HALF_TOLERANCE) -> dict:
    """`arch`'s tiny random model, or with `gguf` that file's real weights (transformers' reference from the same file)."""
    t0 = time.time()
    if gguf is None:
        folder = tiny_models.save(arch, work / arch)
        hf, _ = tiny_models.make(arch)
        w = open_checkpoint(folder)
    else:
        w = open_gguf(gguf)
        hf = w.hf
        hf.config._attn_implementation = "eager"
    spec = describe(w.conf)
    arch = spec.model_type if gguf is not None else arch
    model = PackedDecoder(spec, w, embed_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    V = spec.vocab
    prefix = torch.randint(0, V, (22,), generator=g).tolist()
    branches = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 9, 7)]
    targets = torch.randint(0, V, (3, 4), generator=g)
    empty = torch.zeros(2, spec.layers, spec.kv_heads, 0, spec.head_dim)
    ref = reference(hf, prefix, branches, targets)
    out = {"arch": arch}
    with torch.no_grad():
        got, present = model(*packed(prefix, branches, targets, empty))
        out["packed"] = float((got - ref).abs().max())
        P = 13
        _, head_kv = model(*packed(prefix[:P], [prefix[P:P + 1]], targets[:1], empty))
        cont, cont_kv = model(*packed(prefix[P:], branches, targets, head_kv))
        out["continued"] = max(float((cont - ref).abs().max()), float((cont_kv - present).abs().max()))

        onnx_path = work / f"{arch}.onnx"
        ex = packed(prefix[:7], [branches[0], branches[1][:3]], targets[:2], torch.zeros(2, spec.layers, spec.kv_heads, 3, spec.head_dim))
        torch.onnx.export(model, ex, str(onnx_path), input_names=INPUTS, output_names=OUTPUTS, opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": {0: "T"}, "position_ids": {0: "T"}, "subtree_end": {0: "T"}, "gather_idx": {0: "N"},
                                        "target_ids": {0: "N", 1: "K"}, "branch_slots": {0: "B", 1: "L"}, "slot_of": {0: "R"},
                                        "past_kv": {3: "P"}, "logprobs": {0: "N", 1: "K"}, "present_kv": {3: "PS"}})
        import onnxruntime as ort

        sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        feed = lambda a: {n: t.numpy() for n, t in zip(INPUTS, a)}  # noqa: E731
        o1 = sess.run(["logprobs"], feed(packed(prefix, branches, targets, empty)))[0]
        _, kv = sess.run(None, feed(packed(prefix[:P], [prefix[P:P + 1]], targets[:1], empty)))
        o2 = sess.run(["logprobs"], feed(packed(prefix[P:], branches, targets, torch.from_numpy(kv))))[0]
        out["onnx"] = max(float(np.abs(o1 - ref.numpy()).max()), float(np.abs(o2 - ref.numpy()).max()))

        # The half-precision GPU graph (half_graph.py, as a build gets it from its float32 GPU graph): within
        # issue 74's distance of float32 (its products and weights in float16, on the CPU's float16 kernels).
        import onnx
        from gpu_graph import GpuDecoder
        from half_graph import fuse_attention, halve, save

        gpu_path = work / f"{arch}.gpu.onnx"
        torch.onnx.export(GpuDecoder(spec, w).eval(), ex, str(gpu_path), input_names=INPUTS, output_names=OUTPUTS, opset_version=17,
                          dynamo=False, dynamic_axes={"input_ids": {0: "T"}, "position_ids": {0: "T"}, "subtree_end": {0: "T"},
                                                      "gather_idx": {0: "N"}, "target_ids": {0: "N", 1: "K"}, "branch_slots": {0: "B", 1: "L"},
                                                      "slot_of": {0: "R"}, "past_kv": {3: "P"}, "logprobs": {0: "N", 1: "K"},
                                                      "present_kv": {3: "PS"}})
        half = onnx.load(str(gpu_path), load_external_data=True)
        own_attention = any(x is not None for x in spec.windows) or spec.attn_softcap is not None or abs(spec.attn_scale - spec.head_dim ** -0.5) > 1e-12
        if not own_attention:
            fuse_attention(half, {"layers": spec.layers, "kv_heads": spec.kv_heads, "head_dim": spec.head_dim})
        halve(half, "float16", set())
        save(half, work / f"{arch}.gpu16.onnx")
        del half
        sess16 = ort.InferenceSession(str(work / f"{arch}.gpu16.onnx"), providers=["CPUExecutionProvider"])
        o16 = sess16.run(["logprobs"], feed(packed(prefix, branches, targets, empty)))[0]
        out["half"] = float(np.abs(o16 - ref.numpy()).max())
        out["half_attention"] = "plain" if own_attention else "fused"

        from batch_graph import BatchDecoder, join

        batch = BatchDecoder(model).eval()
        other = torch.randint(0, V, (17,), generator=g).tolist()
        passes = [packed(prefix[P:], branches, targets, head_kv), packed(other, branches[:2], targets[:2], empty),
                  packed(prefix, branches[2:], targets[2:], empty)]
        feeds, rows, widths = join(passes, [head_kv.shape[3], 0, 0])
        together, _ = batch(*[torch.from_numpy(f) for f in feeds])
        alone = [ref, reference(hf, other, branches[:2], targets[:2]), ref[2:]]
        out["batch"] = max(float((together[r][:, :wd] - a).abs().max()) for a, r, wd in zip(alone, rows, widths))
    out["windows"] = [w_ for w_ in spec.windows]
    out["seconds"] = round(time.time() - t0, 1)
    out["ok"] = all(out[k] <= tolerance for k in ("packed", "continued", "onnx", "batch")) and out["half"] <= half_tolerance
    if gguf is not None:
        out["gguf"], out["layers"], out["parameters"] = gguf.name, spec.layers, w.n_params
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", nargs="*", default=sorted(tiny_models.configs()))
    ap.add_argument("--gguf", nargs="*", type=Path, default=[], help="real weights to check instead of the tiny models")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--half-tolerance", type=float, default=HALF_TOLERANCE)
    args = ap.parse_args()
    torch.set_num_threads(1 if not args.gguf else torch.get_num_threads())
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for arch, gguf in ([(None, g) for g in args.gguf] if args.gguf else [(a, None) for a in args.arch]):
            r = check(arch, Path(tmp), gguf, args.tolerance, args.half_tolerance)
            ok = ok and r["ok"]
            print(json.dumps(r), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
