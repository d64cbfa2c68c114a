"""A build's batch graph: passes of several requests in one run, each read exactly as alone.

`model.onnx` (export_onnx.py) runs one request's pass: a causal prefix and branches that each see the
whole prefix. The batch graph (`model.batch.onnx`, same weights, same int8 rewrite) runs N such passes
at once, and every attention row of every pass computes what it computes in `model.onnx`, bit for
bit: the W8A8 graph turns float noise of 1e-7 into log-probability shifts of 0.1-0.5 (an activation
that crosses a rounding step of its row's int8 scale), so "close" is not enough. Two facts about the
CPU kernels (measured, docs/experiments/batching.md) fix the layout: softmax sums a row in 16-wide
lanes, so a row's keys must sit at the same offsets as alone; a MatMul sums K in blocks of 256 from
0, so they must start where they start alone. Appended keys with probability 0 change nothing. So:

  own keys       each request's keys [past | prefix] gathered once per layer ([N, Km], padded at the end),
                 read by its prefix rows and by all its branch rows, as model.onnx's branches share its prefix;
  prefix rows    [N, Sm] rows against their request's own keys from 0, causal;
  branch rows    [N, Bm, Lm] slots (a request's branches, padded to the most any request has), each row
                 [own past | own prefix | own block | pad] gathered from the scores, its values summed in
                 two products as model.onnx sums them (prefix part, then block part).

Inputs (src/inference/batch.ts builds them)
  input_ids, position_ids [T]; gather_idx [G]; target_ids [G, K]; past_kv [2, layers, kv_heads, P, D]
  pre_rows [N, Sm]   token of each request's prefix rows (pad: any token)
  pre_keys [N, Km]   key of each (pool = past_kv's P keys, then one per token), own past then own prefix
  pre_bias [N, Sm, Km]   0 / -inf: causal within the request's own keys
  br_rows [N, Bm, Lm]    token of each branch slot (model.onnx's branch_slots, per request; pad: its first token)
  br_bias [N, Bm, Lm, Km + Lm]   0 / -inf: its own keys, then model.onnx's block mask (a pad branch: key 0)
  row_cols [N, Bm, Lm, Km + Lm]  column of cat(own key scores, block scores, -inf) at each place of the row
  blk_cols [N, Bm, Lm, Lm]   place in the row of each block column (pad: a -inf place)
  pref_keep [N, Km]  1 for the request's own keys, 0 after
  row_src [T]        each token's row in cat(prefix rows, branch slots)
Outputs
  logprobs [G, K]; present_kv [2, layers, kv_heads, P + T, D] (the pool: a request keeps its own)

    python scripts/batch_graph.py --build models/cache/<build> --gguf .cache/weights/<recipe>.gguf
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from decoder import INPUTS, OUTPUTS, PackedDecoder, describe, open_weights  # noqa: E402
from export_onnx import packed_example, sess_run  # noqa: E402

BATCH_INPUTS = ["input_ids", "position_ids", "gather_idx", "target_ids", "past_kv", "pre_rows", "pre_keys", "pre_bias",
                "br_rows", "br_bias", "row_cols", "blk_cols", "pref_keep", "row_src"]
FILE = "model.batch.onnx"
# The layout of the inputs above; src/inference/batch.ts BATCH_LAYOUT builds the same and uses a build's
# batch graphs only when its manifest's `batch_layout` says this.
LAYOUT = 2


def log(msg: str) -> None:
    print(f"[batch-graph] {msg}", flush=True)


class BatchDecoder(nn.Module):
    """PackedDecoder's weights and arithmetic, laid out for N passes (module docstring)."""

    def __init__(self, m: PackedDecoder):
        super().__init__()
        self.m = m

    def forward(self, input_ids, position_ids, gather_idx, target_ids, past_kv, pre_rows, pre_keys, pre_bias,
                br_rows, br_bias, row_cols, blk_cols, pref_keep, row_src):
        m = self.m
        T = input_ids.shape[0]
        N, Sm = pre_rows.shape[0], pre_rows.shape[1]
        Km = pre_keys.shape[1]
        Bm, Lm = br_rows.shape[1], br_rows.shape[2]
        H, KV, D = m.n_heads, m.n_kv, m.head_dim
        rep = H // KV
        x = m.embed_tokens(input_ids)
        tables = m.rope_tables(position_ids)
        neg = torch.full((H, N, Bm, Lm, 1), float("-inf"))
        rows = row_cols.unsqueeze(0).expand(H, N, Bm, Lm, Km + Lm)
        blk = blk_cols.unsqueeze(0).expand(H, N, Bm, Lm, Lm)
        keep = pref_keep.view(N, 1, 1, Km)
        pre_flat, br_flat = pre_keys.reshape(-1), br_rows.reshape(-1)
        present = []

        # Sliding-window layers (decoder.py): the same biases, and keys further back than the window by position.
        # A request's own keys are its past (positions 0, 1, ...) and then its prefix, whose positions continue
        # the past's: own key j sits at position j (pad keys after them are hidden by pre_bias anyway).
        windows = {}
        for w in sorted({w for w in m.spec.windows if w is not None}):
            kpos = torch.arange(Km, dtype=torch.int64).unsqueeze(0).expand(N, Km)
            ppos = position_ids.index_select(0, pre_rows.reshape(-1)).view(N, Sm)
            bpos = position_ids.index_select(0, br_flat).view(N, Bm, Lm)
            own = m.window(bpos.view(N, Bm * Lm), kpos, w).view(N, Bm, Lm, Km)
            windows[w] = (pre_bias + m.window(ppos, kpos, w), br_bias + torch.cat((own, m.window(bpos, bpos, w)), -1))

        def heads(t: torch.Tensor, *shape: int) -> torch.Tensor:  # [KV, n, D] -> [H, *shape, D], as model.onnx expands
            return t.view(KV, 1, -1, D).expand(KV, rep, t.shape[1], D).reshape(H, *shape, D)

        for li, layer in enumerate(m.layers):
            cos, sin = tables[m.spec.rope_of[li]]
            q, k, v = m.project(layer, x, cos, sin, T)
            kpool = torch.cat((past_kv[0, li], k), 1)                                   # [KV, P+T, D]
            vpool = torch.cat((past_kv[1, li], v), 1)
            present.append(torch.stack((kpool, vpool)))
            w = m.spec.windows[li]
            pb, bb = windows[w] if w is not None else (pre_bias, br_bias)

            # each request's own keys [past | prefix] from 0, once: its prefix rows and its branch rows read them
            kk = heads(kpool.index_select(1, pre_flat), N, Km)                            # [H, N, Km, D]
            vv = heads(vpool.index_select(1, pre_flat), N, Km)

            # prefix rows: causal within the request's own keys
            qp = q.index_select(1, pre_rows.reshape(-1)).view(H, N, Sm, D)
            att = torch.softmax(m.cap(qp @ kk.transpose(-1, -2)) + pb, dim=-1)
            out_p = (att @ vv).view(H, N * Sm, D)

            # branch rows: [own keys | own block | pad], as model.onnx's cat(prefix scores, block scores);
            # all of a request's branches against its keys in one product, as model.onnx's branches share them
            qb = q.index_select(1, br_flat).view(H, N, Bm * Lm, D)
            ks = heads(k.index_select(1, br_flat), N * Bm, Lm)                            # [H, N*Bm, Lm, D]
            vs = heads(v.index_select(1, br_flat), N * Bm, Lm)
            s1 = m.cap(qb @ kk.transpose(-1, -2)).view(H, N, Bm, Lm, Km)
            s2 = m.cap(qb.view(H, N * Bm, Lm, D) @ ks.transpose(-1, -2)).view(H, N, Bm, Lm, Lm)
            scores = torch.cat((s1, s2), -1) + bb
            p = torch.softmax(torch.gather(torch.cat((scores, neg), -1), 4, rows), dim=-1)   # [H, N, Bm, Lm, Km+Lm]
            own = ((p[..., :Km] * keep).view(H, N, Bm * Lm, Km) @ vv).view(H, N * Bm, Lm, D)
            out_b = own + torch.gather(p, 4, blk).view(H, N * Bm, Lm, Lm) @ vs
            out = torch.cat((out_p, out_b.view(H, N * Bm * Lm, D)), 1).index_select(1, row_src)  # [H, T, D]

            x = m.finish(layer, x, out.transpose(0, 1).reshape(T, H * D))

        return m.read_out(x, gather_idx, target_ids), torch.stack(present, 1)


def join(passes: list[tuple], past_lens: list[int]):
    """The batch graph's inputs for `passes` (model.onnx's inputs, one tuple per pass), as batch.ts builds them.

    Returns the feeds (numpy) and, per pass, its rows of the output and its own width.
    """
    n = len(passes)
    ids, pos = [], []
    tok_off, pool_past = [], []
    # A past several passes continue (the same tensor memory, as the engine's cached preamble) is in the pool once.
    first_at: dict[int, int] = {}
    kept = []
    t = p_off = 0
    for (a, past) in zip(passes, past_lens):
        tok_off.append(t)
        key = a[7].data_ptr() if hasattr(a[7], "data_ptr") else id(a[7])
        if past > 0 and key in first_at:
            pool_past.append(first_at[key])
        else:
            first_at[key] = p_off
            pool_past.append(p_off)
            kept.append(a[7].numpy() if hasattr(a[7], "numpy") else a[7])
            p_off += past
        ids += a[0].tolist()
        pos += a[1].tolist()
        t += len(a[0])
    P = p_off
    T = t
    S = [len(a[0]) - len(a[6]) for a in passes]
    K = [pl + s for pl, s in zip(past_lens, S)]
    own = [[pool_past[r] + c for c in range(past_lens[r])] + [P + tok_off[r] + i for i in range(S[r])] for r in range(n)]
    Sm, Km = max(S), max(K)
    pre_rows = np.zeros((n, Sm), np.int64)
    pre_keys = np.zeros((n, Km), np.int64)
    pre_bias = np.full((n, Sm, Km), -np.inf, np.float32)
    for r in range(n):
        pre_rows[r, : S[r]] = np.arange(tok_off[r], tok_off[r] + S[r])
        pre_keys[r, : K[r]] = own[r]
        for i in range(Sm):
            pre_bias[r, i, : (past_lens[r] + i + 1 if i < S[r] else 1)] = 0
    Bm = max(a[5].shape[0] for a in passes)
    Lm = max(a[5].shape[1] for a in passes)
    W = Km + Lm
    br_rows = np.zeros((n, Bm, Lm), np.int64)
    br_bias = np.full((n, Bm, Lm, W), -np.inf, np.float32)
    row_cols = np.full((n, Bm, Lm, W), W, np.int64)
    blk_cols = np.zeros((n, Bm, Lm, Lm), np.int64)
    pref_keep = np.zeros((n, Km), np.float32)
    row_src = np.zeros(T, np.int64)
    for r, a in enumerate(passes):
        for i in range(S[r]):
            row_src[tok_off[r] + i] = r * Sm + i
        pref_keep[r, : K[r]] = 1
        slots, slot_of, end = a[5].numpy(), a[6].numpy(), a[2].numpy()
        Bp, Lp = slots.shape
        br_rows[r] = tok_off[r]
        br_bias[r, :, :, 0] = 0  # a pad row sees the request's first key (finite, discarded)
        row_cols[r, :, :, 0] = 0
        blk_cols[r, Bp:] = W - 1  # a pad branch's row sees only place 0 (a real branch's are set below)
        for b in range(Bp):
            sl = slots[b]
            valid = slot_of[sl - S[r]] == np.arange(b * Lp, (b + 1) * Lp)
            br_rows[r, b, :Lp] = tok_off[r] + sl
            br_rows[r, b, Lp:] = tok_off[r] + sl[0]
            for l in range(Lm):
                br_bias[r, b, l, : K[r]] = 0
                for j in range(Lp):
                    if l < Lp and valid[j] and sl[j] <= sl[l] <= end[sl[j]]:
                        br_bias[r, b, l, Km + j] = 0
                for c in range(W):
                    row_cols[r, b, l, c] = c if c < K[r] else Km + (c - K[r]) if c < K[r] + Lp else W
                for j in range(Lm):
                    blk_cols[r, b, l, j] = K[r] + j if j < Lp else K[r] + Lp
            for l in range(Lp):
                if valid[l]:
                    row_src[tok_off[r] + sl[l]] = n * Sm + (r * Bm + b) * Lm + l
    gather, width = [], max(a[4].shape[1] for a in passes)
    tgt, rows = [], []
    for r, a in enumerate(passes):
        rows.append(list(range(len(gather), len(gather) + len(a[3]))))
        gather += (a[3].numpy() + tok_off[r]).tolist()
        t_ = np.zeros((a[4].shape[0], width), np.int64)
        t_[:, : a[4].shape[1]] = a[4].numpy()
        tgt.append(t_)
    past = np.concatenate(kept, axis=3)
    feeds = [np.array(ids, np.int64), np.array(pos, np.int64), np.array(gather, np.int64), np.concatenate(tgt), past,
             pre_rows, pre_keys, pre_bias, br_rows, br_bias, row_cols, blk_cols, pref_keep, row_src]
    return feeds, rows, [a[4].shape[1] for a in passes]


def check(graph: Path, alone_graph: Path, feeds, passes, rows, widths) -> float:
    """The largest |dlogprob| between each pass of the batch (through `graph`) and the pass alone (through `alone_graph`)."""
    got = sess_run(graph, BATCH_INPUTS, [torch.from_numpy(f) for f in feeds])
    alone = [sess_run(alone_graph, INPUTS, a) for a in passes]
    return max(float(np.abs(got[r][:, :w] - al).max()) for al, r, w in zip(alone, rows, widths))


def probe(tok, vocab: int, manifest: dict, first_pass):
    """A batch of three passes on real text: one continuing cached keys and values, two fresh (one on the same state)."""
    kv = manifest["kv"]
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
            "from 1887 to 1889.")
    branches = [" Question: Is the tower in Paris? Answer:", " Question: Who designed it? Answer:",
                " Question: When was it built? Answer:"]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    state, questions = enc(text), [enc(b) for b in branches]
    other = enc("Water boils at 100 degrees Celsius at sea level.")
    head_kv = first_pass(packed_example(state[:-2], [state[-2:-1]], vocab, empty))
    reqs = [(state[-2:], questions, head_kv), (other, questions[:2], empty), (state, questions[2:], empty)]
    passes = [packed_example(p, b, vocab, k) for p, b, k in reqs]
    feeds, rows, widths = join(passes, [k.shape[3] for _, _, k in reqs])
    return passes, feeds, rows, widths


def build_base(build: Path, gguf: Path, manifest: dict, tok, t0: float):
    """model.onnx's batch twin from the GGUF, checked in float32 against the packed decoder: the int8 graph
    (not yet written) and the probe batch, or None where the float32 check fails."""
    log(f"reading weights from {gguf.name} ... ")
    w = open_weights(gguf)
    w.hf = None
    spec = describe(w.conf)
    model = PackedDecoder(spec, w).eval()
    del w
    batch = BatchDecoder(model).eval()
    vocab = spec.vocab
    with torch.no_grad():
        passes, feeds, rows, widths = probe(tok, vocab, manifest, lambda ex: model(*ex)[1].numpy())
        together, _ = batch(*[torch.from_numpy(f) for f in feeds])
        fdiff = max(float((together[r][:, :w] - model(*a)[0]).abs().max()) for a, r, w in zip(passes, rows, widths))
    log(f"float32, three passes in one run vs each alone: max |dlogprob| = {fdiff:.2e}")
    if fdiff > 1e-4:
        log("the batch graph disagrees with the packed decoder")
        return None

    fp32_dir = build / "batch-fp32"
    shutil.rmtree(fp32_dir, ignore_errors=True)
    fp32_dir.mkdir()
    dyn = {"input_ids": {0: "T"}, "position_ids": {0: "T"}, "gather_idx": {0: "G"}, "target_ids": {0: "G", 1: "K"},
           "past_kv": {3: "P"}, "pre_rows": {0: "N", 1: "Sm"}, "pre_keys": {0: "N", 1: "Km"}, "pre_bias": {0: "N", 1: "Sm", 2: "Km"},
           "br_rows": {0: "N", 1: "Bm", 2: "Lm"}, "br_bias": {0: "N", 1: "Bm", 2: "Lm", 3: "KmLm"},
           "row_cols": {0: "N", 1: "Bm", 2: "Lm", 3: "KmLm"}, "blk_cols": {0: "N", 1: "Bm", 2: "Lm", 3: "Lm2"}, "pref_keep": {0: "N", 1: "Km"},
           "row_src": {0: "T"}, "logprobs": {0: "G", 1: "K"}, "present_kv": {3: "PT"}}
    log(f"exporting the batch graph ... {time.time() - t0:.0f}s")
    with torch.no_grad():
        torch.onnx.export(batch, tuple(torch.from_numpy(f) for f in feeds), str(fp32_dir / "model.onnx"), input_names=BATCH_INPUTS,
                          output_names=OUTPUTS, dynamic_axes=dyn, opset_version=17, dynamo=False, external_data=True)
    del model, batch
    import gc
    import logging

    import onnx
    from w8a8 import rewrite

    gc.collect()
    logging.disable(logging.INFO)
    g = onnx.load(str(fp32_dir / "model.onnx"), load_external_data=True)
    g, n = rewrite(g)
    log(f"  {n} MatMuls rewritten as in model.onnx ... {time.time() - t0:.0f}s")
    shutil.rmtree(fp32_dir)
    return g, (passes, feeds, rows, widths)


def save_checked(g, build: Path, name: str, alone: str, probe_batch) -> bool:
    """Writes `g` as build/name once every pass of the probe batch reads through it exactly as through build/alone."""
    import onnx

    tmp = build / (name + ".partial")
    data = name + ".data"
    for stale in (tmp, build / data):
        stale.unlink(missing_ok=True)
    onnx.save_model(g, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
    passes, feeds, rows, widths = probe_batch
    d = check(tmp, build / alone, feeds, passes, rows, widths)
    log(f"{name}: three passes in one run vs each alone through {alone}: max |dlogprob| = {d:.2e}")
    if d > 1e-4:
        tmp.unlink()
        (build / data).unlink(missing_ok=True)
        log(f"{name} reads a pass differently from {alone}; not written")
        return False
    tmp.rename(build / name)
    return True


def write_twins(build: Path, gguf: Path, manifest: dict, tok, graphs: list[str], t0: float) -> int:
    """The batch twin of each graph in `graphs` (model.onnx → model.batch.onnx, model.<v>.onnx →
    model.<v>.batch.onnx: int8_graphs.py's rewrite of model.onnx's twin), each checked against its graph.
    model.onnx's twin comes from the GGUF; written only when asked for or when another twin is made from it
    on disk (one twin alone, say u8 x u8 on a CPU without VNNI, is rewritten from it in memory)."""
    import logging

    import onnx
    from int8_graphs import REWRITES, VARIANTS

    logging.disable(logging.INFO)
    vocab = int(manifest["vocab_size"])
    variant_of = {file: v for v, file in VARIANTS.items()}
    todo = [f for f in graphs if (build / f).exists() and not (build / f.replace(".onnx", ".batch.onnx")).exists()]
    variants = [f for f in todo if f in variant_of]
    base = None
    if not (build / FILE).exists() and todo:
        base = build_base(build, gguf, manifest, tok, t0)
        if base is None:
            return 3
        if "model.onnx" in todo or len(variants) > 1:
            if not save_checked(base[0], build, FILE, "model.onnx", base[1]):
                return 3
            base = None
    for file in variants:
        twin = file.replace(".onnx", ".batch.onnx")
        g = base[0] if base is not None else onnx.load(str(build / FILE), load_external_data=True)
        n = REWRITES[variant_of[file]](g)
        log(f"{twin}: {n} MatMulInteger nodes rewritten as in {file}")
        passes, feeds, rows, widths = probe(tok, vocab, manifest, lambda ex: sess_run(build / file, INPUTS, ex, ("logprobs", "present_kv"))[1])
        if not save_checked(g, build, twin, file, (passes, feeds, rows, widths)):
            return 3
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, type=Path, help="an exported build's folder (model.onnx, manifest.json)")
    ap.add_argument("--gguf", "--from", dest="gguf", required=True, type=Path, help="the build's weights: a GGUF file or a checkpoint folder")
    ap.add_argument("--graphs", nargs="+", metavar="FILE",
                    help="the graphs whose batch twins to write (the ones this machine serves; bootstrap passes "
                         "them); default: every graph of the build, less s8 x s8 where no CUDA can check it")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    t0 = time.time()
    build: Path = args.build
    manifest = json.loads((build / "manifest.json").read_text())
    if manifest.get("quantization", {}).get("op") != "MatMulInteger":
        log(f"{build}: not a W8A8 build; no batch graph")
        return 0
    tok = AutoTokenizer.from_pretrained(str(build))
    if manifest.get("batch_layout") != LAYOUT:
        # Graphs of an earlier layout take other inputs: written again from the weights.
        for stale in build.glob("*.batch.onnx*"):
            stale.unlink()
    graphs = args.graphs
    if graphs is None:
        import onnxruntime as ort
        from int8_graphs import VARIANTS

        # No CUDA here to check an s8 x s8 twin on; written where that graph is used, on a GPU server.
        cuda = "CUDAExecutionProvider" in ort.get_available_providers()
        graphs = ["model.onnx", *(f for v, f in VARIANTS.items() if v != "s8s8" or cuda)]
    rc = write_twins(build, args.gguf, manifest, tok, graphs, t0)
    if rc == 0 and manifest.get("batch_layout") != LAYOUT:
        manifest["batch_layout"] = LAYOUT
        tmp = build / "manifest.json.partial"
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.rename(build / "manifest.json")
    log(f"batch graphs of {build.name} ready in {time.time() - t0:.0f}s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
