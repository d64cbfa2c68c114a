"""float16 or bfloat16 for the half-precision GPU graph (scripts/half_graph.py): which reads closer to float32.

Runs the GPU graph's decoder (scripts/gpu_graph.py's GpuDecoder, from the build's GGUF) in torch on
the CPU on the engine's own passes (bench/gpu-check-passes.json: the primary and small cells, recorded
from the pipeline), three ways:

    float32    model.gpu.onnx's arithmetic
    float16    every product against a weight (q, k, v, o, gate, up, down, the head) with its operands
    bfloat16   and weights rounded to half and its output rounded to half (float32 accumulation, as
               cuBLAS and onnxruntime's kernels sum), the embedding table in half; all else float32:
               what scripts/half_graph.py writes

and compares the passes' read-outs (log-probabilities of the option tokens) with float32's. A pass
that continues recorded keys (`pastTokens`) continues keys computed here from the pass's first
`pastTokens` tokens, in the same arithmetic. It also reports, per layer, the largest |value| float32
meets at each product's input and output and in the residual stream, against float16's 65504: a
product whose output passes it is inf in float16; a norm's squares pass it once |x| > 256.

    .cache/pyenv/bin/python bench/half-precision.py --gguf .cache/weights/qwen2.5-coder-0.5b-instruct.gguf
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from export_onnx import packed_example  # noqa: E402
from gpu_graph import GpuDecoder, gguf_weights  # noqa: E402

FP16_MAX = 65504.0
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class Stats:
    def __init__(self) -> None:
        self.on = False
        self.max: dict[str, float] = {}
        self.inf: dict[str, int] = {}

    def see(self, key: str, t: torch.Tensor) -> None:
        if self.on:
            v = float(t.abs().max())
            self.max[key] = max(self.max.get(key, 0.0), v)


STATS = Stats()


class Weight:
    """A weight whose product `h @ w` runs in `dtype` (operands and output rounded, float32 accumulation)."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype | None, key: str):
        # Half values held in float32: torch's CPU float16 GEMM is ~50x slower than float32's, and a
        # float32 product of half operands, rounded to half, is what a float32-accumulating kernel returns.
        self.w = w if dtype is None else w.to(dtype).float()
        self.dtype = dtype
        self.key = key

    def __rmatmul__(self, h: torch.Tensor) -> torch.Tensor:
        STATS.see(f"{self.key}.in", h)
        if self.dtype is None:
            y = h @ self.w
        else:
            hh = h.to(self.dtype)
            y = (hh.float() @ self.w).to(self.dtype)
            n = int(torch.isinf(y).sum()) + int(torch.isinf(hh).sum())
            if n:
                STATS.inf[self.key] = STATS.inf.get(self.key, 0) + n
            y = y.float()
        STATS.see(f"{self.key}.out", y)
        return y


class StudyDecoder(GpuDecoder):
    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        STATS.see("residual", x)
        STATS.see(f"residual.{self._layer}", x)
        self._layer += 1
        return super().rms(x, w)

    def forward(self, *a):
        self._layer = 0
        return super().forward(*a)


def set_arith(model: StudyDecoder, ws: dict, dtype: torch.dtype | None) -> None:
    """Every weight product of `model` in dtype (None: float32); the embedding table rounded to it."""
    for i, m in enumerate(model.layers):
        for n in ("q", "k", "v", "o", "gate", "up", "down"):
            setattr(m, f"{n}_t", Weight(ws[(i, n)], dtype, f"{i}.{n}"))
    model.lm_head_t = Weight(ws["head"], dtype, "head")  # type: ignore[assignment]
    model.embed = torch.nn.Parameter(ws["embed"] if dtype is None else ws["embed"].to(dtype).float(), requires_grad=False)


def passes_of(file: Path, cells: list[str]) -> list[tuple[str, dict]]:
    d = json.loads(file.read_text())
    return [(f"{c}#{i}", p) for c in cells for i, p in enumerate(d["passes"][c])]


def run_pass(model: StudyDecoder, p: dict, vocab: int) -> torch.Tensor:
    t = lambda k: torch.tensor(p[k], dtype=torch.int64)  # noqa: E731
    P = int(p["pastTokens"])
    empty = np.zeros((2, model.n_layers, model.n_kv, 0, model.head_dim), dtype=np.float32)
    past = torch.from_numpy(empty)
    if P:
        # The keys the pass continues: its own first P tokens at positions 0..P-1, in this arithmetic.
        ids = p["inputIds"][:P]
        _, past = model(*packed_example(ids, [ids[-1:]], vocab, empty))
    rows, width = int(p["rows"]), int(p["width"])
    slots = t("branchSlots").view(int(p["branches"]), int(p["branchWidth"]))
    lp, _ = model(t("inputIds"), t("positionIds"), t("subtreeEnd"), t("gatherIdx"), t("targetIds").view(rows, width),
                  slots, t("slotOf"), past)
    return lp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--passes", type=Path, default=ROOT / "bench" / "gpu-check-passes.json")
    ap.add_argument("--cells", default="primary,small")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    logging.disable(logging.INFO)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    cfg, sd = gguf_weights(args.gguf)
    vocab = int(cfg["vocab_size"])
    model = StudyDecoder(cfg, sd).eval()
    ws = {"embed": model.embed.detach(), "head": model.lm_head_t.detach()}
    for i, m in enumerate(model.layers):
        for n in ("q", "k", "v", "o", "gate", "up", "down"):
            ws[(i, n)] = getattr(m, f"{n}_t").detach()
            delattr(m, f"{n}_t")
    del model.lm_head_t
    del sd
    passes = passes_of(args.passes, args.cells.split(","))
    sizes = ", ".join(f"{k} {len(p['inputIds'])}" for k, p in passes)
    print(f"[half] {args.gguf.name}: {len(passes)} passes ({sizes} tokens); weights read in {time.time() - t0:.0f}s", flush=True)

    out: dict = {"gguf": args.gguf.name, "passes": {k: len(p["inputIds"]) for k, p in passes}, "modes": {}}
    ref: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for mode, dtype in (("float32", None), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            set_arith(model, ws, dtype)
            STATS.on = mode == "float32"
            STATS.inf = {}
            worst = 0.0
            per: dict[str, float] = {}
            t1 = time.time()
            for k, p in passes:
                lp = run_pass(model, p, vocab)
                if mode == "float32":
                    ref[k] = lp
                else:
                    d = float((lp - ref[k]).abs().max())
                    per[k] = round(d, 4)
                    worst = max(worst, d)
            STATS.on = False
            out["modes"][mode] = {"max_abs_dlogprob": round(worst, 4), "per_pass": per, "inf": dict(STATS.inf),
                                  "seconds": round(time.time() - t1, 1)}
            print(f"[half] {mode}: max |dlogprob| vs float32 {worst:.4f} {per} inf {STATS.inf} ({time.time() - t1:.0f}s)", flush=True)

    # The largest |value| float32 meets, by layer.
    L = len(model.layers)
    rows = []
    for i in range(L):
        r = {"layer": i, "residual_in": STATS.max.get(f"residual.{2 * i}", 0.0)}
        for n in ("q", "k", "v", "o", "gate", "up", "down"):
            r[f"{n}.in"] = STATS.max.get(f"{i}.{n}.in", 0.0)
            r[f"{n}.out"] = STATS.max.get(f"{i}.{n}.out", 0.0)
        rows.append(r)
    out["max_abs"] = rows
    out["head"] = {"in": STATS.max.get("head.in"), "out": STATS.max.get("head.out"), "final_residual": STATS.max.get(f"residual.{2 * L}")}
    print("\n| layer | residual in | largest product input (which) | largest product output (which) | down in | down out |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ins = max(((r[f"{n}.in"], n) for n in ("q", "k", "v", "o", "gate", "up", "down")))
        outs = max(((r[f"{n}.out"], n) for n in ("q", "k", "v", "o", "gate", "up", "down")))
        print(f"| {r['layer']} | {r['residual_in']:.1f} | {ins[0]:.1f} ({ins[1]}) | {outs[0]:.1f} ({outs[1]}) | {r['down.in']:.1f} | {r['down.out']:.1f} |")
    print(f"head: input {out['head']['in']:.1f}, logits {out['head']['out']:.1f}; final residual {out['head']['final_residual']:.1f}")
    peak_prod = max(max(r[f"{n}.out"] for n in ("q", "k", "v", "o", "gate", "up", "down")) for r in rows)
    peak_res = max(r["residual_in"] for r in rows)
    print(f"largest product output {peak_prod:.1f} (float16 max {FP16_MAX:.0f}); largest residual {peak_res:.1f} "
          f"(its square {peak_res ** 2:.3g}: {'overflows' if peak_res ** 2 > FP16_MAX else 'fits'} float16)")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"[half] done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
