"""The device check's peer: what a Python user would run on the same GPU for the same work.

transformers' Qwen2ForCausalLM at a shipped model's real shapes (scripts/gpu_graph.py's SHAPES) with
random weights, in bfloat16 with PyTorch's scaled-dot-product attention (attn_implementation="sdpa"),
running the passes the engine runs for each cell of bench/gpu-check-passes.json: per recorded pass,
one forward of its tokens (input ids and positions as recorded) after a key/value cache of as many
tokens as the pass continues (`pastTokens`, filled before the timing and cut back after each pass),
with the logits of the pass's read-out rows only (`logits_to_keep`, the rows the engine gathers) and
their log-softmax at the target ids. The attention is causal over the pass's tokens, where the engine's
graph masks each option's branch off the others: the same tokens, and no less attention work.

The small cell's requests run one after another, as a GPU lane of the engine runs them ("peer"); the
same requests in one batch of as many ("peer-batch") is what a Python server that batches would do.
Tokens per second per cell go to RESULTS/peer.json and RESULTS/peer-batch.json in the form
bench/gpu-check.mjs writes its lanes in; its table shows them beside the engine's lanes.

    python3 bench/gpu-peer.py --model qwen2.5-coder-1.5b --results /tmp/assay-gpu-check/results
    python3 bench/gpu-peer.py --model qwen2.5-coder-0.5b --cells primary,small --runs 1 --concurrent 2 --device cpu ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))


def log(msg: str) -> None:
    print(f"[gpu-peer] {msg}", file=sys.stderr, flush=True)


def shapes(model: str) -> dict:
    from gpu_graph import SHAPES  # the same table the engine's random graphs are built from

    return SHAPES[model]


def build(model: str, device: str, dtype: torch.dtype):
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = shapes(model)
    cfg = Qwen2Config(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        m = Qwen2ForCausalLM(cfg)
    m = m.to(dtype).eval()
    impl = getattr(m.config, "_attn_implementation", None)
    if impl != "sdpa":
        raise SystemExit(f"transformers chose attention {impl!r}, not sdpa")
    return m, f"transformers {transformers.__version__}"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--cells", default="", help="comma-separated cells of bench/gpu-check-passes.json (default: all)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per cell, after a first one")
    ap.add_argument("--concurrent", type=int, default=8, help="the small cell's requests")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--no-batch", action="store_true", help="skip the small cell's requests in one batch")
    ap.add_argument("--results", type=Path, required=True, help="the folder bench/gpu-check.mjs reads lanes from")
    args = ap.parse_args()

    from transformers import DynamicCache

    fixture = json.loads((HERE / "gpu-check-passes.json").read_text())
    cells = [c for c in args.cells.split(",") if c] or list(fixture["passes"])
    dtype = getattr(torch, args.dtype)
    dev = args.device
    t0 = time.perf_counter()
    model, tf = build(args.model, dev, dtype)
    sync(dev)
    load_ms = (time.perf_counter() - t0) * 1000
    vocab = shapes(args.model)["vocab_size"]
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else platform.processor() or "cpu"
    log(f"{args.model} on {name}, {args.dtype}, sdpa, {tf}, PyTorch {torch.__version__}: built in {load_ms:.0f} ms")

    def prepare(passes: list[dict], batch: int):
        """Each pass's tensors, and a filled cache per distinct past length (random tokens: speed, not answers)."""
        g = torch.Generator().manual_seed(1)
        caches: dict[int, DynamicCache] = {}
        out = []
        for p in passes:
            P = int(p["pastTokens"])
            if P and P not in caches:
                c = DynamicCache()
                ids = torch.randint(0, vocab, (batch, P), generator=g).to(dev)
                with torch.inference_mode():
                    model(input_ids=ids, past_key_values=c, use_cache=True, logits_to_keep=1)
                caches[P] = c
            T = len(p["inputIds"])
            rows, width = int(p["rows"]), int(p["width"])
            out.append({
                "P": P,
                "ids": torch.tensor(p["inputIds"], dtype=torch.long, device=dev).clamp_(max=vocab - 1).expand(batch, T),
                "pos": torch.tensor(p["positionIds"], dtype=torch.long, device=dev).expand(batch, T),
                "keep": torch.tensor(p["gatherIdx"], dtype=torch.long, device=dev),
                "targets": torch.tensor(p["targetIds"], dtype=torch.long, device=dev).clamp_(max=vocab - 1).view(1, rows, width).expand(batch, rows, width),
            })
        return out, caches

    def run(prepared, caches) -> None:
        with torch.inference_mode():
            for q in prepared:
                cache = caches.get(q["P"])
                o = model(input_ids=q["ids"], position_ids=q["pos"], past_key_values=cache, use_cache=cache is not None, logits_to_keep=q["keep"])
                torch.log_softmax(o.logits.float(), dim=-1).gather(-1, q["targets"])
                if cache is not None:
                    # Back to the past alone (a negative count removes that many tokens, in transformers 4 and 5 alike).
                    cache.crop(-(cache.get_seq_length() - q["P"]))

    lanes = {"peer": [], "peer-batch": []}
    for cell in cells:
        if cell not in fixture["passes"]:
            raise SystemExit(f"bench/gpu-check-passes.json records no cell {cell}")
        passes = fixture["passes"][cell]
        T = sum(len(p["inputIds"]) for p in passes)
        n = args.concurrent if cell == "small" else 1
        for lane, batch in (("peer", 1), ("peer-batch", n)):
            if lane == "peer-batch" and (n == 1 or args.no_batch):
                continue
            prepared, caches = prepare(passes, batch)
            repeat = n if batch == 1 else 1
            sync(dev)
            w0 = time.perf_counter()
            run(prepared, caches)
            sync(dev)
            first_ms = (time.perf_counter() - w0) * 1000
            times = []
            for _ in range(args.runs):
                s = time.perf_counter()
                for _ in range(repeat):
                    run(prepared, caches)
                sync(dev)
                times.append((time.perf_counter() - s) * 1000)
            ms = sorted(times)[len(times) // 2]
            row = {"cell": cell, "tokens": T * n, "passes": len(passes) * repeat, "requests": n, "runs": len(times),
                   "first_ms": round(first_ms), "ms": round(ms, 1), "tok_s": round(T * n / ms * 1000)}
            if batch > 1:
                row["batched"] = True
            lanes[lane].append(row)
            log(f"{lane} {cell}: {T * n} tokens in {row['passes']} passes, {ms:.1f} ms ({row['tok_s']} tok/s; first run {first_ms:.0f} ms)")
            del prepared, caches
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()

    args.results.mkdir(parents=True, exist_ok=True)
    for lane, rows in lanes.items():
        if not rows:
            continue
        note = ("the small cell's requests as one batch" if lane == "peer-batch"
                else "causal attention over each recorded pass's tokens, its past as a filled cache, logits of the read-out rows only")
        r = {"lane": lane, "provider": "torch", "graph": f"Qwen2ForCausalLM {args.dtype} sdpa", "load_ms": round(load_ms), "rows": rows,
             "runtime": f"PyTorch {torch.__version__} + {tf}", "device": name,
             "host": f"{platform.processor() or platform.machine()} × {os.cpu_count()}", "note": note,
             "at": datetime.now(timezone.utc).isoformat()}
        (args.results / f"{lane}.json").write_text(json.dumps(r, indent=2))
    if dev.startswith("cuda"):
        log(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
