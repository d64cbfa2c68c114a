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
from torch import nn


def log(msg: str) -> None:
    print(f"[export] {msg}", flush=True)


class PackedDecoder(nn.Module):
    """Llama/Qwen2-style decoder (RMSNorm, RoPE, GQA, SwiGLU) with a tree mask.

    Linear layers are explicit matmuls against pre-transposed weights so the
    exporter emits MatMul (quantizable to MatMulNBits), never Gemm.
    """

    def __init__(self, cfg: dict, sd: dict[str, torch.Tensor]):
        super().__init__()
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.hidden = cfg["hidden_size"]
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = float(cfg["rms_norm_eps"])
        rope = cfg.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

        # fp16 embedding table: the gather reads a few rows, halving 500+ MB of RAM.
        self.embed = nn.Parameter(sd["model.embed_tokens.weight"].half(), requires_grad=False)
        lm = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        self.lm_head_t = nn.Parameter(lm.t().contiguous(), requires_grad=False)
        self.final_norm = nn.Parameter(sd["model.norm.weight"], requires_grad=False)

        def p(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.contiguous(), requires_grad=False)

        self.layers = nn.ModuleList()
        for i in range(self.n_layers):
            pre = f"model.layers.{i}."
            m = nn.Module()
            m.ln1 = p(sd[pre + "input_layernorm.weight"])
            m.ln2 = p(sd[pre + "post_attention_layernorm.weight"])
            for name in ("q", "k", "v", "o"):
                w = sd[pre + f"self_attn.{name}_proj.weight"]
                setattr(m, f"{name}_t", p(w.t()))
                b = sd.get(pre + f"self_attn.{name}_proj.bias")
                setattr(m, f"{name}_b", p(b) if b is not None else None)
            m.gate_t = p(sd[pre + "mlp.gate_proj.weight"].t())
            m.up_t = p(sd[pre + "mlp.up_proj.weight"].t())
            m.down_t = p(sd[pre + "mlp.down_proj.weight"].t())
            self.layers.append(m)

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * w

    @staticmethod
    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, input_ids, position_ids, subtree_end, gather_idx, target_ids):
        T = input_ids.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        x = torch.nn.functional.embedding(input_ids, self.embed).float()

        idx = torch.arange(T, dtype=torch.int64)
        allowed = (idx.unsqueeze(0) <= idx.unsqueeze(1)) & (idx.unsqueeze(1) <= subtree_end.unsqueeze(0))
        bias = torch.zeros(T, T, dtype=torch.float32).masked_fill(~allowed, float("-inf"))

        freqs = position_ids.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(0), emb.sin().unsqueeze(0)  # [1, T, D]
        scale = 1.0 / math.sqrt(D)

        for m in self.layers:
            h = self.rms(x, m.ln1)
            q = h @ m.q_t
            k = h @ m.k_t
            v = h @ m.v_t
            if m.q_b is not None:
                q = q + m.q_b
                k = k + m.k_b
                v = v + m.v_b
            q = q.view(T, H, D).transpose(0, 1)
            k = k.view(T, KV, D).transpose(0, 1)
            v = v.view(T, KV, D).transpose(0, 1)
            q = q * cos + self.rotate(q) * sin
            k = k * cos + self.rotate(k) * sin
            rep = H // KV
            k = k.unsqueeze(1).expand(KV, rep, T, D).reshape(H, T, D)
            v = v.unsqueeze(1).expand(KV, rep, T, D).reshape(H, T, D)
            att = torch.softmax((q @ k.transpose(1, 2)) * scale + bias, dim=-1)
            o = (att @ v).transpose(0, 1).reshape(T, H * D)
            o = o @ m.o_t
            if m.o_b is not None:
                o = o + m.o_b
            x = x + o
            h = self.rms(x, m.ln2)
            x = x + (torch.nn.functional.silu(h @ m.gate_t) * (h @ m.up_t)) @ m.down_t

        h = self.rms(x.index_select(0, gather_idx), self.final_norm)
        logits = h @ self.lm_head_t
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        return torch.gather(logits, 1, target_ids) - lse


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def example_inputs(T: int, prefix: int, n_branch: int, vocab: int):
    """A state of `prefix` tokens and `n_branch` equal branches after it."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (T,), generator=g)
    blen = (T - prefix) // n_branch
    pos = torch.arange(T)
    end = torch.full((T,), T - 1, dtype=torch.int64)
    gather = []
    for b in range(n_branch):
        s = prefix + b * blen
        e = s + blen - 1
        pos[s : e + 1] = torch.arange(prefix, prefix + blen)
        end[s : e + 1] = e
        gather.append(e)
    return ids, pos, end, torch.tensor(gather), torch.randint(0, vocab, (n_branch, 3), generator=g)


def packed_example(prefix: list[int], branches: list[list[int]], vocab: int):
    """The packed layout the engine sends: a prefix, then one chain per branch."""
    ids = list(prefix)
    pos = list(range(len(prefix)))
    end = [-1] * len(prefix)
    gather = []
    for b in branches:
        start = len(ids)
        ids += b
        pos += range(len(prefix), len(prefix) + len(b))
        end += [start + len(b) - 1] * len(b)
        gather.append(start + len(b) - 1)
    T = len(ids)
    end = [T - 1 if e < 0 else e for e in end]
    g = torch.Generator().manual_seed(0)
    tgt = torch.randint(0, vocab, (len(branches), 8), generator=g)
    tgt[:, 0] = 16  # one common token ("1") among the random ones
    as_t = lambda a: torch.tensor(a, dtype=torch.int64)
    return as_t(ids), as_t(pos), as_t(end), as_t(gather), tgt


def sess_run(path: Path, names: list[str], ex) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {n: t.numpy() for n, t in zip(names, ex)})[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--source", default="{}", help="JSON describing where the weights came from")
    ap.add_argument("--weights", default="w8a8", choices=["w8a8", "int4"])
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--keep-fp32", action="store_true")
    ap.add_argument("--expect", default="{}", help="JSON of GGUF metadata fields that must match")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    out: Path = args.out
    import gguf

    reader = gguf.GGUFReader(str(args.gguf))
    meta = {}
    for key in ("general.architecture", "general.name", "general.basename", "general.size_label",
                "general.finetune", "general.file_type"):
        if key in reader.fields:
            meta[key] = reader.fields[key].contents()
    log(f"GGUF metadata: {meta}")
    for key, want in json.loads(args.expect).items():
        if meta.get(key) != want:
            log(f"GGUF metadata {key} = {meta.get(key)!r}, expected {want!r}: refusing to convert")
            return 4
    del reader
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log(f"reading tokenizer from {args.gguf.name}")
    tok = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    tok.save_pretrained(str(out))
    log(f"reading weights (dequantizing to float32) ... {time.time() - t0:.0f}s")
    hf = AutoModelForCausalLM.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32)
    hf.eval()
    cfg = hf.config.to_dict()
    arch = cfg["model_type"]
    if arch not in ("qwen2", "llama"):
        log(f"architecture {arch} is not supported by the packed exporter")
        return 2
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    model = PackedDecoder(cfg, sd).eval()
    vocab = int(cfg["vocab_size"])

    sys.path.insert(0, str(Path(__file__).parent))
    # The packed graph must agree with the reference implementation: a branch
    # scored inside a packed sequence must equal the same tokens run alone.
    with torch.no_grad():
        ids, pos, end, gat, tgt = example_inputs(48, 24, 3, vocab)
        packed = model(ids, pos, end, gat, tgt)
        b = 1
        blen = 8
        alone_ids = torch.cat([ids[:24], ids[24 + b * blen : 24 + (b + 1) * blen]])
        ref = torch.log_softmax(hf(alone_ids.unsqueeze(0)).logits[0, -1], -1)[tgt[b]]
        diff = (packed[b] - ref).abs().max().item()
        log(f"packed vs reference (transformers) max |dlogprob| = {diff:.2e}")
        if diff > 1e-3:
            log("packed decoder disagrees with the reference model")
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
            example_inputs(48, 24, 3, vocab),
            str(fp32_path),
            input_names=["input_ids", "position_ids", "subtree_end", "gather_idx", "target_ids"],
            output_names=["logprobs"],
            dynamic_axes={
                "input_ids": {0: "T"},
                "position_ids": {0: "T"},
                "subtree_end": {0: "T"},
                "gather_idx": {0: "N"},
                "target_ids": {0: "N", 1: "K"},
                "logprobs": {0: "N", 1: "K"},
            },
            opset_version=17,
            dynamo=False,
            external_data=True,
        )

    import logging
    import onnx

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
        # accuracy_level 4 = int8 activations per block *per row*: a token's
        # result never depends on the other tokens in the packed batch.
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
    ex = packed_example(tok(text, add_special_tokens=False)["input_ids"],
                        [tok(b, add_special_tokens=False)["input_ids"] for b in branches], vocab)
    names = ["input_ids", "position_ids", "subtree_end", "gather_idx", "target_ids"]
    ref = sess_run(fp32_path, names, ex)
    got = sess_run(qpath, names, ex)
    qdiff = float(np.abs(got - ref).max())
    log(f"{args.weights} vs float32: max |dlogprob| = {qdiff:.3f} over {ref.size} read-outs")
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
        "format": "assay-packed-v1",
        "architecture": arch,
        "name": cfg.get("_name_or_path") or args.gguf.stem,
        "vocab_size": vocab,
        "context_length": int(cfg.get("max_position_embeddings", 4096)),
        "hidden_size": int(cfg["hidden_size"]),
        "num_layers": int(cfg["num_hidden_layers"]),
        "parameters": int(sum(v.numel() for v in sd.values())),
        "quantization": quant,
        "chat_template": tok.chat_template if isinstance(tok.chat_template, str) else None,
        "special_tokens": special,
        "eos_token_id": tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None,
        "source": {**json.loads(args.source), "gguf_metadata": meta},
        "build_hash": h.hexdigest()[:16],
        "calibration": None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out}/manifest.json (build {manifest['build_hash']}) in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
