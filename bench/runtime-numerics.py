#!/usr/bin/env python3
"""Does a build read the same bits on another onnxruntime? The check before a runtime bump lands.

Runs a build's graph on a fixed packed pass (a 300-token prefix and four branches, seeded ids)
under each onnxruntime given, each in its own process, and prints the largest |difference| of the
log-probabilities against the first. Given two graphs (`--graph` twice: a build's old export and its
new one), it runs every runtime on each and compares all against the first graph on the first runtime. With --kernel it also runs onnxruntime's fused
SimplifiedLayerNormalization alone on fixed rows, against the norm as export format v4 writes it
(one float32 running sum of squares per row, then x / sqrt(mean + eps) * w), which is the kernel
1.23-1.29 ran; 1.30's sums in another order.

Each runtime is a folder holding an `onnxruntime` package, installed beside the build venv's numpy:

    pip install --no-deps --target /tmp/ort/1.29.0 onnxruntime==1.29.0
    .cache/pyenv/bin/python bench/runtime-numerics.py --graph models/cache/qwen2.5-coder-0.5b-instruct/model.onnx \\
        --ort /tmp/ort/1.23.2 --ort /tmp/ort/1.30.0 [--level all|extended|basic|disabled] [--disable NAME] [--kernel]

`--ort -` is the venv's own onnxruntime. `--disable` names a graph optimizer to leave out (e.g.
SimplifiedLayerNormFusion): how a changed fused kernel is found.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC", "disabled": "ORT_DISABLE_ALL"}


def packed_feeds(names: list[str], past_shape: list[int]) -> dict[str, np.ndarray]:
    """The engine's packed layout (scripts/export_onnx.py `packed_example`) on seeded ids, no past."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(100, 30000, 300).tolist()
    branches = [rng.integers(100, 30000, n).tolist() for n in (18, 25, 12, 30)]
    ids, pos, end, gather, blocks = list(prefix), list(range(len(prefix))), [-1] * len(prefix), [], []
    for b in branches:
        s = len(ids)
        ids += b
        pos += range(len(prefix), len(prefix) + len(b))
        end += [s + len(b) - 1] * len(b)
        gather.append(s + len(b) - 1)
        blocks.append((s, len(b)))
    T, S = len(ids), len(prefix)
    end = [T - 1 if e < 0 else e for e in end]
    L = max(n for _, n in blocks)
    slots = np.zeros((len(blocks), L), np.int64)
    slot_of = np.zeros(sum(n for _, n in blocks), np.int64)
    for i, (st, n) in enumerate(blocks):
        slots[i, :n] = np.arange(st, st + n)
        slots[i, n:] = st
        slot_of[st - S : st - S + n] = np.arange(i * L, i * L + n)
    tgt = rng.integers(100, 30000, (len(branches), 8))
    tgt[:, 0] = 16
    feeds = {
        "input_ids": np.array(ids, np.int64), "position_ids": np.array(pos, np.int64),
        "subtree_end": np.array(end, np.int64), "gather_idx": np.array(gather, np.int64),
        "target_ids": tgt.astype(np.int64), "branch_slots": slots, "slot_of": slot_of,
        "past_kv": np.zeros(past_shape, np.float32),
    }
    return {k: v for k, v in feeds.items() if k in names}


def norm_rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((512, 896)) * rng.choice([0.1, 1, 30], (512, 1))).astype(np.float32)
    x[:, 5] *= 50  # an outlier channel, as the models' activations have
    return x, (rng.standard_normal(896) * 0.3 + 1).astype(np.float32)


def child(args: argparse.Namespace) -> None:
    """One runtime: write the logprobs (and the fused norm's output) to args.child."""
    import onnxruntime as ort

    args.graph = args.graph[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[args.level])
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(args.graph, so, providers=["CPUExecutionProvider"], disabled_optimizers=args.disable)
    names = [i.name for i in s.get_inputs()]
    past = s.get_inputs()[names.index("past_kv")].shape
    out = {"lp": s.run(["logprobs"], packed_feeds(names, [d if isinstance(d, int) else 0 for d in past]))[0]}
    if args.kernel:
        from onnx import TensorProto, helper

        x, w = norm_rows()
        g = helper.make_graph(
            [helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-6)], "norm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, x.shape[1]]),
             helper.make_tensor_value_info("w", TensorProto.FLOAT, [x.shape[1]])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, x.shape[1]])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        out["norm"] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "w": w})[0]
    np.savez(args.child, version=ort.__version__, **out)


def running_sum_norm() -> np.ndarray:
    """The v4 graph's norm in numpy: squares summed one by one in float32, as the graph's CumSum does."""
    x, w = norm_rows()
    ss = np.zeros((x.shape[0], 1), np.float32)
    for h in range(x.shape[1]):
        ss += x[:, h : h + 1] * x[:, h : h + 1]
    return (x / np.sqrt(ss / np.float32(x.shape[1]) + np.float32(1e-6))) * w


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", action="append", required=True)
    ap.add_argument("--ort", action="append", default=[], help="a folder holding an onnxruntime package; - for the venv's")
    ap.add_argument("--level", default="all", choices=list(LEVELS))
    ap.add_argument("--disable", action="append", default=[])
    ap.add_argument("--kernel", action="store_true")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if not args.ort:
        ap.error("name at least one --ort")
    rows, first, ref = [], None, running_sum_norm() if args.kernel else None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (graph, where) in enumerate((g, o) for g in args.graph for o in args.ort):
            env = dict(os.environ)
            if where != "-":
                env["PYTHONPATH"] = os.path.abspath(where) + os.pathsep + env.get("PYTHONPATH", "")
            out = os.path.join(tmp, f"{i}.npz")
            cmd = [sys.executable, __file__, "--graph", graph, "--level", args.level, "--child", out]
            cmd += [x for d in args.disable for x in ("--disable", d)] + (["--kernel"] if args.kernel else [])
            subprocess.run(cmd, env=env, check=True)
            r = np.load(out)
            first = r if first is None else first
            row = {"graph": graph, "onnxruntime": str(r["version"]), "max_abs_dlogprob_vs_first": float(np.abs(r["lp"] - first["lp"]).max())}
            if args.kernel:
                row["fused_norm_elements_unlike_running_sum"] = int((r["norm"] != ref).sum())
            rows.append(row)
    print(f"level {args.level}" + (f", without {', '.join(args.disable)}" if args.disable else ""))
    for row in rows:
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
