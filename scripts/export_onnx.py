"""Convert a GGUF causal LM into assay's packed-scoring ONNX graph.

The graph takes one *packed* sequence: the state, then every question's suffix,
then (where labels need several tokens) the label-trie nodes, laid out in
depth-first order. Attention is a tree: token i sees token j iff j is an
ancestor-or-self of i. With a DFS layout that is `j <= i <= subtree_end[j]`, so
one int64 vector describes any tree and the T x T mask is built inside the
graph instead of being shipped from JavaScript.

Inputs
  input_ids    int64 [T]
  position_ids int64 [T]     positions restart after the state for each branch
  subtree_end  int64 [T]     last index of the DFS subtree rooted at each token
  gather_idx   int64 [N]     tokens whose next-token distribution is read
  target_ids   int64 [N, K]  token ids read at each gathered token
Output
  logprobs     float [N, K]  log-softmax over the whole vocabulary, gathered

Only N x K floats leave the session: the worker never sees vocabulary-wide
logits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from decoder import INPUTS, OUTPUTS, PackedDecoder, Unsupported, describe, open_weights, reference_model  # noqa: E402, F401
from fetch_weights import sha256 as sha256_file  # noqa: E402


def log(msg: str) -> None:
    print(f"[export] {msg}", flush=True)


def branch_layout(S: int, blocks: list[tuple[int, int]]):
    """branch_slots [B, L] and slot_of [R] for blocks (start, length) after a prefix of S."""
    L = max(n for _, n in blocks)
    slots = torch.zeros(len(blocks), L, dtype=torch.int64)
    R = sum(n for _, n in blocks)
    slot_of = torch.zeros(R, dtype=torch.int64)
    for b, (start, n) in enumerate(blocks):
        slots[b, :n] = torch.arange(start, start + n)
        slots[b, n:] = start
        slot_of[start - S : start - S + n] = torch.arange(b * L, b * L + n)
    return slots, slot_of


def no_past(model: "PackedDecoder", P: int = 0) -> torch.Tensor:
    return torch.zeros(2, model.n_layers, model.n_kv, P, model.head_dim)


def example_inputs(T: int, prefix: int, n_branch: int, vocab: int, past: torch.Tensor):
    """A state of `prefix` tokens and `n_branch` equal branches after it, continuing `past`."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (T,), generator=g)
    blen = (T - prefix) // n_branch
    pos = torch.arange(T)
    end = torch.full((T,), T - 1, dtype=torch.int64)
    gather = []
    blocks = []
    for b in range(n_branch):
        s = prefix + b * blen
        e = s + blen - 1 if b < n_branch - 1 else T - 1
        pos[s : e + 1] = torch.arange(prefix, prefix + e + 1 - s)
        end[s : e + 1] = e
        gather.append(e)
        blocks.append((s, e + 1 - s))
    slots, slot_of = branch_layout(prefix, blocks)
    pos = pos + past.shape[3]
    return ids, pos, end, torch.tensor(gather), torch.randint(0, vocab, (n_branch, 3), generator=g), slots, slot_of, past


def packed_example(prefix: list[int], branches: list[list[int]], vocab: int, past: np.ndarray):
    """The packed layout the engine sends: a prefix continuing `past`, then one chain per branch."""
    P = past.shape[3]
    ids = list(prefix)
    pos = list(range(P, P + len(prefix)))
    end = [-1] * len(prefix)
    gather = []
    blocks = []
    for b in branches:
        start = len(ids)
        ids += b
        pos += range(P + len(prefix), P + len(prefix) + len(b))
        end += [start + len(b) - 1] * len(b)
        gather.append(start + len(b) - 1)
        blocks.append((start, len(b)))
    T = len(ids)
    end = [T - 1 if e < 0 else e for e in end]
    g = torch.Generator().manual_seed(0)
    tgt = torch.randint(0, vocab, (len(branches), 8), generator=g)
    tgt[:, 0] = 16  # one common token ("1") among the random ones
    as_t = lambda a: torch.tensor(a, dtype=torch.int64)
    slots, slot_of = branch_layout(len(prefix), blocks)
    return as_t(ids), as_t(pos), as_t(end), as_t(gather), tgt, slots, slot_of, torch.from_numpy(past)


def sess_run(path: Path, names: list[str], ex, outputs=("logprobs",)):
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = s.run(list(outputs), {n: t.numpy() for n, t in zip(names, ex)})
    return got[0] if len(outputs) == 1 else got


def gguf_metadata(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = {}
    for key in ("general.architecture", "general.name", "general.basename", "general.size_label",
                "general.finetune", "general.file_type"):
        if key in reader.fields:
            meta[key] = reader.fields[key].contents()
    return meta


def main() -> int:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path)
    src.add_argument("--from", dest="checkpoint", type=Path, help="a Hugging Face checkpoint folder (or a GGUF file)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--source", default="{}", help="JSON describing where the weights came from")
    ap.add_argument("--weights", default="w8a8", choices=["w8a8", "int4"])
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--keep-fp32", action="store_true")
    ap.add_argument("--expect", default="{}", help="JSON of GGUF metadata fields that must match")
    ap.add_argument("--reference-limit", type=float, default=2e9,
                    help="check against transformers' own model where the model has at most this many parameters "
                         "(a checkpoint's reference is a second float32 copy of the model); a GGUF's is always checked")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    out: Path = args.out
    source: Path = args.gguf or args.checkpoint
    is_gguf = not source.is_dir()
    meta = {}
    if is_gguf:
        meta = gguf_metadata(source)
        log(f"GGUF metadata: {meta}")
        for key, want in json.loads(args.expect).items():
            if meta.get(key) != want:
                log(f"GGUF metadata {key} = {meta.get(key)!r}, expected {want!r}: refusing to convert")
                return 4
    else:
        from decoder import check_checkpoint

        # Everything checked before any conversion work: the architecture, every shard, the tokenizer.
        try:
            check_checkpoint(source)
        except (Unsupported, ValueError) as e:
            log(str(e))
            return 2
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log(f"reading tokenizer from {source.name}")
    tok = (AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name) if is_gguf
           else AutoTokenizer.from_pretrained(str(source), local_files_only=True))
    tok.save_pretrained(str(out))
    log(f"reading weights ({'dequantizing ' if is_gguf else ''}to float32) ... {time.time() - t0:.0f}s")
    w = open_weights(source)
    try:
        spec = describe(w.conf)
    except Unsupported as e:
        log(str(e))
        return 2
    arch = spec.model_type
    model = PackedDecoder(spec, w).eval()
    vocab = spec.vocab
    hf = w.hf if is_gguf else (reference_model(w) if w.n_params <= args.reference_limit else None)
    n_params = w.n_params
    w = None

    # The packed graph must agree with the reference implementation: a branch
    # scored inside a packed sequence must equal the same tokens run alone.
    with torch.no_grad():
        ex = example_inputs(49, 24, 3, vocab, no_past(model))
        ids, tgt = ex[0], ex[4]
        packed, present = model(*ex)
        if hf is not None:
            diff = 0.0
            for b, (start, stop) in enumerate([(24, 32), (32, 40), (40, 49)]):
                alone_ids = torch.cat([ids[:24], ids[start:stop]])
                ref = torch.log_softmax(hf(alone_ids.unsqueeze(0)).logits[0, -1], -1)[tgt[b]]
                diff = max(diff, (packed[b] - ref).abs().max().item())
            log(f"packed vs reference (transformers) max |dlogprob| = {diff:.2e}")
            # float32 noise over 24 layers is ~1e-3 on log-probs near -15; a
            # layout bug shows up as differences of 0.1 and more.
            if diff > 1e-2:
                log("packed decoder disagrees with the reference model")
                return 3
        else:
            log(f"no check against transformers' own model: {n_params / 1e9:.1f}B parameters is over "
                f"--reference-limit (the decoder is checked per architecture on tiny models: scripts/check_decoder.py)")
        # The same request with its first 16 prefix tokens taken from an
        # earlier pass's present_kv must read the same.
        P = 16
        head = packed_example(ids[:P].tolist(), [[int(ids[P])]], vocab, no_past(model).numpy())
        _, head_kv = model(*head)
        cont, cont_kv = model(ids[P:], ex[1][P:], ex[2][P:] - P, ex[3] - P, ex[4], ex[5] - P, ex[6], head_kv)
        kdiff = max((cont - packed).abs().max().item(), (cont_kv - present).abs().max().item())
        log(f"prefix from present_kv vs one pass: max |d| = {kdiff:.2e}")
        if kdiff > 1e-4:
            log("a pass continuing past_kv disagrees with the single pass")
            return 3
    del hf

    # torch writes one external file per tensor: keep them in their own folder.
    fp32_dir = out / "fp32"
    fp32_dir.mkdir(exist_ok=True)
    fp32_path = fp32_dir / "model.onnx"
    log(f"exporting ONNX graph ... {time.time() - t0:.0f}s")
    with torch.no_grad():
        torch.onnx.export(
            model,
            # A non-empty past while tracing, so that no shape is specialised to 0.
            example_inputs(49, 24, 3, vocab, no_past(model, 5)),
            str(fp32_path),
            input_names=INPUTS,
            output_names=OUTPUTS,
            dynamic_axes={
                "input_ids": {0: "T"},
                "position_ids": {0: "T"},
                "subtree_end": {0: "T"},
                "gather_idx": {0: "N"},
                "target_ids": {0: "N", 1: "K"},
                "branch_slots": {0: "B", 1: "L"},
                "slot_of": {0: "R"},
                "past_kv": {3: "P"},
                "logprobs": {0: "N", 1: "K"},
                "present_kv": {3: "PS"},
            },
            opset_version=17,
            dynamo=False,
            external_data=True,
        )

    import gc
    import logging
    import onnx

    # The float32 weights live on in torch until here; a 1.5B model would
    # otherwise hold them twice over (torch + the ONNX protobuf) and run out
    # of memory on a 24 GB machine during the rewrite.
    model = packed = ex = None  # noqa: F841 (some are set only when the check runs)
    gc.collect()
    logging.disable(logging.INFO)
    m = onnx.load(str(fp32_path), load_external_data=True)
    if args.weights == "w8a8":
        from w8a8 import rewrite

        log(f"rewriting MatMuls as int8 weights x per-row int8 activations ... {time.time() - t0:.0f}s")
        m, n = rewrite(m)
        log(f"  {n} MatMuls rewritten")
        qinfo = {"weights": "int8 per-channel", "activations": "int8 per-row (dynamic)", "op": "MatMulInteger"}
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        log(f"quantizing MatMul weights to int4 (block {args.block_size}) ... {time.time() - t0:.0f}s")
        # Experiments only: measured, this kernel's result depends on a
        # token's position modulo 32 in the packed sequence (logit shifts of
        # 0.02-0.035), which breaks batch invariance. w8a8 does not.
        q = MatMulNBitsQuantizer(m, bits=4, block_size=args.block_size, is_symmetric=True, accuracy_level=4)
        q.process()
        m = q.model.model
        qinfo = {"weights": "int4", "block_size": args.block_size, "op": "MatMulNBits", "accuracy_level": 4}
    qpath = out / "model.onnx"
    # onnx appends to an existing external-data file: start from nothing.
    for stale in (qpath, out / "model.onnx.data"):
        stale.unlink(missing_ok=True)
    onnx.save_model(m, str(qpath), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    log(f"checking the quantized graph against float32 on real text ... {time.time() - t0:.0f}s")
    import onnxruntime as ort

    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
            "from 1887 to 1889.")
    branches = [" Question: Is the tower in Paris? Answer:", " Question: Who designed it? Answer:",
                " Question: When was it built? Answer:"]
    kv_shape = (2, spec.layers, spec.kv_heads, 0, spec.head_dim)
    empty = np.zeros(kv_shape, dtype=np.float32)
    state = tok(text, add_special_tokens=False)["input_ids"]
    questions = [tok(b, add_special_tokens=False)["input_ids"] for b in branches]
    ex = packed_example(state, questions, vocab, empty)
    ref = sess_run(fp32_path, INPUTS, ex)
    got = sess_run(qpath, INPUTS, ex)
    qdiff = float(np.abs(got - ref).max())
    log(f"{args.weights} vs float32: max |dlogprob| = {qdiff:.3f} over {ref.size} read-outs")
    # The served graph in two passes, as the prefix cache runs it: the state's
    # keys and values from a first pass, then its last two tokens and the
    # questions against them (src/engine/index.ts, COMPUTED_PREFIX_TOKENS).
    _, head_kv = sess_run(qpath, INPUTS, packed_example(state[:-2], [state[-2:-1]], vocab, empty),
                          ("logprobs", "present_kv"))
    two = sess_run(qpath, INPUTS, packed_example(state[-2:], questions, vocab, head_kv))
    sdiff = float(np.abs(two - got).max())
    log(f"{args.weights}, prefix continued from present_kv vs one pass: max |dlogprob| = {sdiff:.2e}")
    if sdiff > 1e-4:
        log("the quantized graph continuing past_kv disagrees with its single pass")
        return 3
    quant = {**qinfo, "embedding": "fp16", "max_abs_logprob_error_vs_fp32": round(qdiff, 4)}
    if not args.keep_fp32:
        shutil.rmtree(fp32_dir)

    # Build hash: the graph, its weights and the tokenizer. Calibration fits are
    # keyed by it and refused for any other build.
    h = hashlib.sha256()
    for name in ("model.onnx", "model.onnx.data", "tokenizer.json"):
        h.update(sha256_file(out / name).encode())
    special = {k: v for k, v in {
        "eos": tok.eos_token, "bos": tok.bos_token, "pad": tok.pad_token}.items() if v is not None}
    manifest = {
        "format": "assay-packed-v4",
        "architecture": arch,
        "name": str(meta.get("general.name") or (source.stem if is_gguf else source.name)),
        "vocab_size": vocab,
        "context_length": spec.context,
        "hidden_size": spec.hidden,
        "num_layers": spec.layers,
        # present_kv / past_kv: [2, layers, kv_heads, tokens, head_dim] float32.
        "kv": {"layers": kv_shape[1], "kv_heads": kv_shape[2], "head_dim": kv_shape[4]},
        "parameters": n_params,
        "quantization": quant,
        "chat_template": tok.chat_template if isinstance(tok.chat_template, str) else None,
        "special_tokens": special,
        "eos_token_id": tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None,
        "source": {**json.loads(args.source), **({"gguf_metadata": meta} if is_gguf else {"checkpoint": str(source.resolve())})},
        "build_hash": h.hexdigest()[:16],
        "calibration": None,
    }
    # Attention that is not plain scaled dot-product over a tree mask (decoder.py): named, so that a graph
    # writer that would rebuild attention from the mask alone (half_graph.py's fused node) keeps it instead.
    own = {k: v for k, v in {
        "sliding_window": next((w for w in spec.windows if w), None),
        "sliding_layers": [i for i, w in enumerate(spec.windows) if w] or None,
        "scale": spec.attn_scale if abs(spec.attn_scale - spec.head_dim ** -0.5) > 1e-12 else None,
        "softcap": spec.attn_softcap, "final_softcap": spec.final_softcap}.items() if v is not None}
    if own:
        manifest["attention"] = own
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out}/manifest.json (build {manifest['build_hash']}) in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
