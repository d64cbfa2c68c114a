"""What a batch of small passes costs through a build's batch graph, against the same passes alone and
against one pass of all their tokens (packing's ceiling), on onnxruntime's CPU provider.

Real weights, real text: eight one-line tickets, each continuing the same cached preamble (as the
general family's requests do) with one question read in two presentations. Prints the ms of each
side (median of --reps), the ratios that say where a batch stands between "no gain" and the ceiling,
the largest |Δ log-probability| of the batch against each pass alone (0: the same bits), and with
--profile the kernel time by operator of the batch run and of the one pass (onnxruntime's profiler).

    .cache/pyenv/bin/python bench/batch-cost.py --build models/cache/<build> [--graph model.u8u8.onnx] [--profile]
        [--scripts <another commit's scripts/> --build <a folder with that commit's batch graph>]

The session options are the worker's (src/inference/worker.ts): 2 intra-op threads, every graph
optimisation, denormals flushed to zero.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

PREAMBLE = ("You are a careful support analyst. Read the customer's ticket below and answer each question about it "
            "with the single word the question asks for, judging only from what the ticket says.\n\nTicket:")
TICKETS = [
    " My invoice for March charged me twice for the same seat; please refund the duplicate.",
    " The export to CSV has been stuck at 99% since this morning and the page never finishes.",
    " I cannot log in after resetting my password, the link says it has expired already.",
    " Your mobile app crashes every time I open the settings tab on my Android phone.",
    " We would like to upgrade from the team plan to the enterprise plan before the next cycle.",
    " The API returns a 502 error for roughly one request in ten since your last deployment.",
    " Please delete my account and all the data you hold about me, as the law allows.",
    " The dark mode colours make the charts impossible to read; the legend is black on grey.",
]
QUESTIONS = ["\nQuestion: Is the customer asking for money back? Answer (yes or no):",
             "\nQuestion: Does the ticket ask for money to be returned? Answer (no or yes):"]


def session(path: Path, profile: str | None = None) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.add_session_config_entry("session.set_denormal_as_zero", "1")
    if profile:
        o.enable_profiling = True
        o.profile_file_prefix = profile
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def feeds_of(names: list[str], tensors) -> dict:
    return {n: (t.numpy() if hasattr(t, "numpy") else t) for n, t in zip(names, tensors)}


def timed(s: ort.InferenceSession, feeds: dict, reps: int) -> float:
    s.run(["logprobs"], feeds)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        s.run(["logprobs"], feeds)
        ts.append((time.perf_counter() - t) * 1000)
    return statistics.median(ts)


def by_op(profile_file: str) -> dict[str, float]:
    """Kernel ms by operator in the last run the profile holds (the first run of a session also pays its warm-up)."""
    events = json.loads(Path(profile_file).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    last = runs[-1]
    ms: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]:
            ms[e["args"]["op_name"]] += e["dur"] / 1000
    return ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, type=Path)
    ap.add_argument("--graph", default="model.onnx", help="the served graph; its batch twin is <graph>.batch.onnx")
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--scripts", type=Path, default=SCRIPTS,
                    help="where batch_graph.py and export_onnx.py are (another commit's, to time its batch graph's layout)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.scripts))
    from batch_graph import BATCH_INPUTS, join
    from export_onnx import INPUTS, packed_example
    from transformers import AutoTokenizer

    build: Path = args.build
    manifest = json.loads((build / "manifest.json").read_text())
    kv = manifest["kv"]
    vocab = int(manifest["vocab_size"])
    tok = AutoTokenizer.from_pretrained(str(build))
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    alone_graph = build / args.graph
    twin = build / args.graph.replace(".onnx", ".batch.onnx")
    one = session(alone_graph)
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    pre = enc(PREAMBLE)
    head = packed_example(pre[:-1], [pre[-1:]], vocab, empty)
    past = one.run(["present_kv"], feeds_of(INPUTS, head))[0]
    qs = [enc(q) for q in QUESTIONS]
    tickets = [enc(t) for t in (TICKETS * (1 + args.passes // len(TICKETS)))[: args.passes]]
    passes = [packed_example(t, qs, vocab, past) for t in tickets]
    joined = packed_example([x for t in tickets for x in t], qs * len(tickets), vocab, past)
    feeds, rows, widths = join(passes, [past.shape[3]] * len(passes))
    # One past per pass in join's pool; the engine holds a shared past once (batch.ts): the same keys.
    batch_feeds = dict(zip(BATCH_INPUTS, feeds))

    alone_ms = [timed(one, feeds_of(INPUTS, p), args.reps) for p in passes]
    joined_ms = timed(one, feeds_of(INPUTS, joined), args.reps)
    bs = session(twin)
    batch_ms = timed(bs, batch_feeds, args.reps)
    got = bs.run(["logprobs"], batch_feeds)[0]
    diff = max(float(np.abs(got[r][:, :w] - one.run(["logprobs"], feeds_of(INPUTS, p))[0]).max()) for p, r, w in zip(passes, rows, widths))
    tokens = [len(p[0]) for p in passes]
    alone = sum(alone_ms)
    print(f"{args.passes} passes of {min(tokens)}-{max(tokens)} tokens after a {past.shape[3]}-token cached preamble, {args.graph}")
    print(f"  alone, one after another   {alone:8.0f} ms  ({statistics.median(alone_ms):.0f} ms each)")
    print(f"  one pass of all their tokens {joined_ms:6.0f} ms  (ceiling: alone / this = {alone / joined_ms:.2f}x)")
    print(f"  the batch graph            {batch_ms:8.0f} ms  (gain: alone / batch = {alone / batch_ms:.2f}x; batch / one pass = {batch_ms / joined_ms:.2f})")
    print(f"  batch vs each alone: max |dlogprob| = {diff:.2e}")
    if args.profile:
        stamp = str(int(time.time()))
        ps = session(twin, f"/tmp/batch-cost-batch-{stamp}")
        ps.run(["logprobs"], batch_feeds)
        ps.run(["logprobs"], batch_feeds)
        b_ops = by_op(ps.end_profiling())
        po = session(alone_graph, f"/tmp/batch-cost-joined-{stamp}")
        po.run(["logprobs"], feeds_of(INPUTS, joined))
        po.run(["logprobs"], feeds_of(INPUTS, joined))
        j_ops = by_op(po.end_profiling())
        print("  kernel ms by operator, a warm run each: batch graph | one pass of all tokens")
        for op in sorted(set(b_ops) | set(j_ops), key=lambda o: -(b_ops.get(o, 0) + j_ops.get(o, 0)))[:16]:
            print(f"    {op:24s} {b_ops.get(op, 0):8.1f} | {j_ops.get(op, 0):8.1f}")
        print(f"    {'all':24s} {sum(b_ops.values()):8.1f} | {sum(j_ops.values()):8.1f}")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
