"""Write a build's half-precision GPU graph, for the CUDA provider, from its float32 GPU graph.

model.gpu.onnx (scripts/gpu_graph.py) multiplies float32 activations by float32 weights. A GPU's
tensor cores multiply in half precision, at several times float32's rate and half its memory traffic.
This graph is model.gpu.onnx with every product against a weight (q, k, v, o, gate, up, down and the
head) in half precision, weights stored in half precision, and the embedding table too:

    Cast(x -> half) -> MatMul(x_h, W_h) -> Cast(-> float32)

Everything else stays float32 as model.gpu.onnx computes it: the residual stream, the norms (their
squares pass 65504 once |x| > 256, which Qwen2.5's residual stream does), the rotary embedding, the
attention's scores, softmax and weighted sums, the bias additions, SiLU, and the final log-softmax.
The inputs and outputs are model.gpu.onnx's (names, float32 / int64 types, shapes): the engine feeds
it unchanged. A product's operands are cast once and shared (q, k and v read one cast of their norm).

The attention (`--attention fused`, the default): each layer's two attention parts (the new prefix rows;
the branch rows against the prefix and their own branch) as onnxruntime's com.microsoft
MultiHeadAttention, which the CUDA provider implements in float32 and float16 and which takes an additive
attention_bias (the tree mask), in float32 as the plain ops compute it (`--attention-dtype float16`
casts around it: unmeasured, the CPU provider runs it in float32); see fuse_attention. `--attention plain`
keeps model.gpu.onnx's MatMul / Softmax ops. model.gpu16.json records which (`attention`).

The products' own range: a half-precision product's output must stay under 65504 (float16) where the
accumulation is float32 (cuBLAS and onnxruntime's CPU kernel sum in float32; the output is rounded).
bench/half-precision.py measures every product's largest input and output in float32 on the
engine's passes (docs/experiments/gpu.md); `--fp32-products` keeps the named weights' products in
float32 where a model needs it.

    model.gpu16.onnx, model.gpu16.onnx.data   the graph and its weights
    model.gpu16.json                          what it was made from and how far it reads from
                                              model.gpu.onnx (onnxruntime's CPU provider, which has
                                              float16 MatMul kernels; bfloat16 has none there, so
                                              a bfloat16 graph is read through its float32 twin)

    python scripts/half_graph.py --build models/cache/qwen2.5-coder-0.5b-instruct [--dtype float16]
           [--attention fused|plain] [--out /tmp/x/model.gpu16.onnx]   # --out: elsewhere, facts beside it
    python scripts/half_graph.py --twin OUT.onnx --graph GRAPH.onnx   # a half graph's float32 twin
    python scripts/half_graph.py --build B --compare A.onnx B.onnx [--cells primary,small,wide:2,many]
                                                   # two graphs on bench/gpu-check-passes.json's passes

The twin (`--twin`): the same graph with every half-precision operation done in float32 on the same
half-precision values: weights upcast exactly, each product's operands rounded to half then computed
in float32, its output rounded to half. It reads what a float32-accumulating half kernel reads, on
a provider that has no half kernels (bfloat16 on the CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from fetch_weights import sha256 as sha256_file  # noqa: E402

HALF_FORMAT = "assay-gpu16-v1"
HALF_GRAPH = "model.gpu16.onnx"
SOURCE_GRAPH = "model.gpu.onnx"
DTYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def log(msg: str) -> None:
    print(f"[half-graph] {msg}", flush=True)


def to_half(t: TensorProto, dtype: str, name: str) -> TensorProto:
    """A float32 initializer as a half-precision one (round to nearest even)."""
    a = numpy_helper.to_array(t).astype(np.float32, copy=False)
    if dtype == "float16":
        return numpy_helper.from_array(a.astype(np.float16), name)
    import torch

    bits = torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).view(torch.int16).numpy()
    out = TensorProto()
    out.name = name
    out.data_type = TensorProto.BFLOAT16
    out.dims.extend(a.shape)
    out.raw_data = bits.tobytes()
    return out


def from_half(t: TensorProto, name: str) -> TensorProto:
    """A half-precision initializer as float32 (exact)."""
    if t.data_type == TensorProto.FLOAT16:
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), name)
    raw = np.frombuffer(t.raw_data, dtype=np.uint16) if t.raw_data else np.array(t.int32_data, dtype=np.uint16)
    a = (raw.astype(np.uint32) << 16).view(np.float32).reshape(tuple(t.dims))
    return numpy_helper.from_array(a, name)


def weight_products(g: onnx.GraphProto) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """The MatMuls whose right operand is a float32 weight (2-D initializer), and the Gathers of a float32 table."""
    inits = {t.name: t for t in g.initializer}
    is_w = lambda n: n in inits and inits[n].data_type == TensorProto.FLOAT and len(inits[n].dims) == 2  # noqa: E731
    mm = [n for n in g.node if n.op_type == "MatMul" and is_w(n.input[1])]
    gathers = [n for n in g.node if n.op_type == "Gather" and is_w(n.input[0])]
    return mm, gathers


def halve(m: onnx.ModelProto, dtype: str, keep_fp32: set[str]) -> dict:
    """Rewrite m in place: weight products (and the embedding Gather) in `dtype`; returns counts."""
    g = m.graph
    to = DTYPES[dtype]
    inits = {t.name: t for t in g.initializer}
    mm, gathers = weight_products(g)
    mm = [n for n in mm if n.input[1] not in keep_fp32]
    targets = {id(n) for n in mm} | {id(n) for n in gathers}
    # An initializer read by anything but the rewritten nodes keeps its float32 copy beside the half one.
    users: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            if i in inits and id(n) not in targets:
                users[i] = users.get(i, 0) + 1
    halved: dict[str, str] = {}

    def half_weight(name: str) -> str:
        if name not in halved:
            new = name if users.get(name, 0) == 0 else f"{name}_{dtype}"
            t = to_half(inits[name], dtype, new)
            if new == name:
                g.initializer.remove(inits[name])
            g.initializer.append(t)
            halved[name] = new
        return halved[name]

    casts: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for n in g.node:
        if id(n) not in targets:
            nodes.append(n)
            continue
        if n.op_type == "MatMul":
            a = n.input[0]
            if a not in casts:
                casts[a] = f"{a}__{dtype}"
                nodes.append(helper.make_node("Cast", [a], [casts[a]], to=to, name=f"{a}__cast_{dtype}"))
            n.input[0] = casts[a]
            n.input[1] = half_weight(n.input[1])
        else:
            n.input[0] = half_weight(n.input[0])
        out = n.output[0]
        n.output[0] = f"{out}__{dtype}"
        nodes.append(n)
        nodes.append(helper.make_node("Cast", [n.output[0]], [out], to=TensorProto.FLOAT, name=f"{out}__cast_float"))
    del g.node[:]
    g.node.extend(nodes)
    return {"products": len(mm), "gathers": len(gathers), "kept_float32": sorted(keep_fp32), "casts_in": len(casts)}


def twin(m: onnx.ModelProto) -> int:
    """Rewrite a half graph in place into float32 arithmetic on the same half values; returns the products rewritten."""
    g = m.graph
    half = set(DTYPES.values())
    inits = {t.name: t for t in g.initializer}
    dtype_of = {t.name: t.data_type for t in g.initializer if t.data_type in half}
    for n in g.node:
        if n.op_type == "Cast" and n.attribute[0].i in half:
            dtype_of[n.output[0]] = n.attribute[0].i
    up: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for n in g.node:
        if n.op_type == "MatMul" and n.input[0] in dtype_of:
            to = dtype_of[n.input[0]]
            for k, i in enumerate(n.input):
                if i in inits and inits[i].data_type in half:
                    if i not in up:
                        up[i] = f"{i}__float"
                        g.initializer.append(from_half(inits[i], up[i]))
                    n.input[k] = up[i]
                elif i in dtype_of:
                    if i not in up:
                        up[i] = f"{i}__float"
                        nodes.append(helper.make_node("Cast", [i], [up[i]], to=TensorProto.FLOAT))
                    n.input[k] = up[i]
            out = n.output[0]
            n.output[0] = f"{out}__float"
            nodes.append(n)
            nodes.append(helper.make_node("Cast", [n.output[0]], [out], to=to))
            count += 1
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    for name in list(up):
        if name in inits:
            g.initializer.remove(inits[name])
    return count


# --- attention as onnxruntime's fused MultiHeadAttention (com.microsoft) -------------------------------------------

MS_DOMAIN = "com.microsoft"
ATTENTION_ALIGN = 16  # query rows and keys padded to a multiple: the CUDA kernel's bias alignment for float32 (4 * 4 bytes)


class _Builder:
    """Appends nodes with fresh names; constants as Constant nodes (the graph's weights file is untouched)."""

    def __init__(self, prefix: str):
        self.prefix, self.n, self.nodes = prefix, 0, []

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{self.prefix}/{hint}_{self.n}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, domain: str | None = None, **attrs) -> str:
        out = self.name(hint or op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, domain=domain, **attrs))
        return out

    def const(self, value, dtype=np.int64, hint: str = "c") -> str:
        out = self.name(hint)
        t = numpy_helper.from_array(np.asarray(value, dtype=dtype), out)
        self.nodes.append(helper.make_node("Constant", [], [out], name=out, value=t))
        return out


def fuse_attention(m: onnx.ModelProto, kv: dict, dtype: str = "float32") -> dict:
    """Rewrite m in place: each layer's tree attention as two com.microsoft MultiHeadAttention nodes.

    The GPU graph (scripts/export_onnx.py, PackedDecoder.forward) computes each layer's attention in two parts:
    the S new prefix rows against the P + S prefix keys (causal), and the branch rows, in slot space [B, L],
    against the prefix keys and their own branch's ancestors, with one softmax over both. Here the same two
    parts, each one MultiHeadAttention (no past/present: the keys are the graph's own, the present_kv output
    is computed as before):

      prefix:   query [1, S, H*D], key/value [1, H, P+S, D], attention_bias [1, 1, S, P+S] (causal)
      branches: query [B, L, H*D], key/value [B, H, P+S+L, D] (the prefix keys, then the branch's own),
                attention_bias [B, 1, L, P+S+L] (0 on the prefix and on a token's ancestors, -inf elsewhere)

    Grouped-query attention: MultiHeadAttention takes as many key/value heads as query heads, so each of the
    KV heads is repeated H/KV times (Expand), query head h reading key/value head h // (H/KV) as the graph does.
    The scale is the graph's 1/sqrt(D) (the attribute, on the un-scaled rotated query). Query rows and keys are
    padded to a multiple of 16 (zero rows whose outputs are dropped; keys masked with -inf), the CUDA
    memory-efficient kernel's alignment for an attention bias in float32. `dtype` float16 casts q, k, v and the
    bias to float16 around each node (its output back to float32).
    """
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    index = {id(n): i for i, n in enumerate(g.node)}
    consts = {}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    for t in g.initializer:
        if not t.dims or int(np.prod(t.dims)) == 1:
            consts.setdefault(t.name, numpy_helper.to_array(t))
    inits = {t.name: t for t in g.initializer}

    def prod(name: str, op: str) -> onnx.NodeProto:
        n = producer.get(name)
        if n is None or n.op_type != op:
            raise ValueError(f"fuse_attention: {name} is not the output of a {op} ({n.op_type if n else 'input'})")
        return n

    # Each layer's keys and values, from present_kv = stack of stack(kp, vp): kp = Concat(past_kv[0, l], k[:, :S]).
    stack = prod("present_kv", "Concat")
    layers = []
    for u in stack.input:
        pair = prod(prod(u, "Unsqueeze").input[0], "Concat")
        found = []
        for half in pair.input:
            cat = prod(prod(half, "Unsqueeze").input[0], "Concat")   # [KV, P+S, D]
            new = prod(cat.input[1], "Slice").input[0]                # [KV, T, D]: all T tokens' keys (values)
            found.append((cat.output[0], new))
        layers.append({"k": found[0], "v": found[1]})
    n_layers = len(layers)
    # The query: the rotated q times the scale 1/sqrt(D), one per layer, in graph order.
    head_dim, KV = int(kv["head_dim"]), int(kv["kv_heads"])
    scale = 1.0 / np.sqrt(head_dim)
    muls = []
    for n in g.node:
        if n.op_type != "Mul":
            continue
        for k_, other in ((0, 1), (1, 0)):
            c = consts.get(n.input[k_])
            if c is not None and c.size == 1 and c.dtype == np.float32 and abs(float(c.reshape(-1)[0]) - scale) < 1e-7:
                muls.append((index[id(n)], n.input[other], float(c.reshape(-1)[0])))
    if len(muls) != n_layers:
        raise ValueError(f"fuse_attention: {len(muls)} query scalings for {n_layers} layers")
    muls.sort()
    # The output projection, whose input is the attention's [T, H*D].
    o_mm = {}
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1].startswith("layers.") and n.input[1].endswith(".o_t"):
            o_mm[int(n.input[1].split(".")[1])] = n
    if sorted(o_mm) != list(range(n_layers)):
        raise ValueError("fuse_attention: the output projections layers.<i>.o_t are not all found")
    hd = int(inits[o_mm[0].input[1]].dims[0])   # H*D
    H = hd // head_dim
    for i, (at, q, sc) in enumerate(muls):
        if not (at < index[id(o_mm[i])] and (i == 0 or index[id(o_mm[i - 1])] < at)):
            raise ValueError(f"fuse_attention: layer {i}'s query is not between its neighbours' output projections")
        layers[i]["q"], layers[i]["scale"] = q, sc
    D = head_dim
    rep = H // KV

    # Shared by every layer: sizes, paddings and the two biases, from the graph's inputs.
    b = _Builder("fused_attention")
    neg = np.float32(-np.inf)
    T1 = b.op("Shape", ["input_ids"], "T")
    R1 = b.op("Shape", ["slot_of"], "R")
    s_len = b.op("Sub", [T1, R1], "S")
    B1 = b.op("Shape", ["branch_slots"], "B", start=0, end=1)
    L1 = b.op("Shape", ["branch_slots"], "L", start=1, end=2)
    P1 = b.op("Shape", ["past_kv"], "P", start=3, end=4)
    ps_len = b.op("Add", [P1, s_len], "PS")
    psl_len = b.op("Add", [ps_len, L1], "PSL")
    zero1, one1 = b.const([0]), b.const([1])
    a1, am1 = b.const([ATTENTION_ALIGN]), b.const([ATTENTION_ALIGN - 1])

    def pad_to(x1: str) -> str:
        """How many rows bring x up to a multiple of the alignment (at least one block when x is 0)."""
        m1 = b.op("Max", [x1, one1])
        up = b.op("Mul", [b.op("Div", [b.op("Add", [m1, am1]), a1]), a1])
        return b.op("Sub", [up, x1], "pad")

    def pads(rank: int, axis: int, amount1: str) -> str:
        parts = [b.const([0] * (rank + axis)), amount1]
        if rank - axis - 1:
            parts.append(b.const([0] * (rank - axis - 1)))
        return b.op("Concat", parts, "pads", axis=0)

    fval = lambda v: b.const(np.float32(v), np.float32)  # noqa: E731
    ninf, fzero = fval(neg), fval(0.0)
    pq_pre, pk_pre = pad_to(s_len), pad_to(ps_len)
    pq_br, pk_br = pad_to(L1), pad_to(psl_len)

    # Prefix bias [1, 1, S, P+S]: row i sees keys c <= P + i.
    i_col = b.op("Unsqueeze", [b.op("Range", [b.const(0), b.op("Squeeze", [s_len, zero1]), b.const(1)]), one1])
    c_row = b.op("Unsqueeze", [b.op("Range", [b.const(0), b.op("Squeeze", [ps_len, zero1]), b.const(1)]), zero1])
    ok_pre = b.op("LessOrEqual", [b.op("Sub", [c_row, P1]), i_col])
    bias_pre = b.op("Where", [ok_pre, fzero, ninf], "bias_prefix")
    bias_pre = b.op("Pad", [bias_pre, pads(2, 1, pk_pre), ninf], mode="constant")
    bias_pre = b.op("Pad", [bias_pre, pads(2, 0, pq_pre), fzero], mode="constant")
    bias_pre = b.op("Unsqueeze", [bias_pre, b.const([0, 1])], "bias_prefix")

    # Branch bias [B, 1, L, P+S+L]: every prefix key, then key slot l' of the same branch when it is a real token
    # (slot_of[slots - S] == slot) and an ancestor of the query token (key <= query <= subtree_end[key]).
    flat = b.op("Reshape", ["branch_slots", b.const([-1])], "flat")
    BL1 = b.op("Mul", [B1, L1])
    slot_ids = b.op("Range", [b.const(0), b.op("Squeeze", [BL1, zero1]), b.const(1)])
    valid = b.op("Equal", [b.op("Gather", ["slot_of", b.op("Sub", [flat, s_len])], axis=0), slot_ids])
    shape_b1l = b.op("Concat", [B1, one1, L1], axis=0)
    gq = b.op("Unsqueeze", ["branch_slots", b.const([2])])
    gk = b.op("Unsqueeze", ["branch_slots", one1])
    endk = b.op("Reshape", [b.op("Gather", ["subtree_end", flat], axis=0), shape_b1l])
    ok_br = b.op("And", [b.op("And", [b.op("LessOrEqual", [gk, gq]), b.op("LessOrEqual", [gq, endk])]),
                         b.op("Reshape", [valid, shape_b1l])])
    every = b.op("ConstantOfShape", [b.op("Concat", [B1, L1, ps_len], axis=0)],
                 value=helper.make_tensor("v", TensorProto.BOOL, [1], [True]))
    bias_br = b.op("Where", [b.op("Concat", [every, ok_br], axis=2), fzero, ninf], "bias_branch")
    bias_br = b.op("Pad", [bias_br, pads(3, 2, pk_br), ninf], mode="constant")
    bias_br = b.op("Pad", [bias_br, pads(3, 1, pq_br), fzero], mode="constant")
    bias_br = b.op("Unsqueeze", [bias_br, one1], "bias_branch")

    half = dtype == "float16"
    to16 = lambda x: b.op("Cast", [x], to=TensorProto.FLOAT16) if half else x  # noqa: E731
    to32 = lambda x: b.op("Cast", [x], to=TensorProto.FLOAT) if half else x  # noqa: E731
    bias_pre, bias_br = to16(bias_pre), to16(bias_br)
    q_shape_pre = b.const([1, -1, hd])
    q_shape_br = b.op("Concat", [B1, L1, b.const([hd])], axis=0)
    shared = b.nodes

    per_layer: dict[int, list[onnx.NodeProto]] = {}
    for li, lay in enumerate(layers):
        b.nodes = []
        kp, k_all = lay["k"]
        vp, v_all = lay["v"]
        q = lay["q"]                                       # [H, T, D], rotated, not yet scaled
        rep_shape4 = b.const([1, rep, 1, 1])
        rep_shape5 = b.const([1, 1, rep, 1, 1])
        # prefix rows
        qp = b.op("Slice", [q, zero1, s_len, one1])
        qp = b.op("Reshape", [b.op("Transpose", [qp], perm=[1, 0, 2]), q_shape_pre])
        qp = b.op("Pad", [qp, pads(3, 1, pq_pre), fzero], mode="constant")
        kvp = []
        for x in (kp, vp):
            x = b.op("Pad", [x, pads(3, 1, pk_pre), fzero], mode="constant")            # [KV, P+S+pad, D]
            x = b.op("Expand", [b.op("Unsqueeze", [x, one1]), rep_shape4])              # [KV, rep, ., D]
            kvp.append(to16(b.op("Reshape", [x, b.const([1, H, -1, D])])))              # [1, H, ., D]
        out_p = b.op("MultiHeadAttention", [to16(qp), kvp[0], kvp[1], "", "", bias_pre], "mha_prefix",
                     domain=MS_DOMAIN, num_heads=H, scale=lay["scale"])
        out_p = b.op("Slice", [b.op("Reshape", [to32(out_p), b.const([-1, hd])]), zero1, s_len, zero1])  # [S, H*D]
        # branch rows, in slot space
        qs = b.op("Gather", [q, flat], axis=1)                                          # [H, B*L, D]
        qs = b.op("Reshape", [b.op("Transpose", [qs], perm=[1, 0, 2]), q_shape_br])     # [B, L, H*D]
        qs = b.op("Pad", [qs, pads(3, 1, pq_br), fzero], mode="constant")
        kvb = []
        for x_p, x_all in ((kp, k_all), (vp, v_all)):
            xs = b.op("Gather", [x_all, flat], axis=1)                                  # [KV, B*L, D]
            xs = b.op("Reshape", [xs, b.op("Concat", [b.const([-1]), B1, L1, b.const([D])], axis=0)])
            xs = b.op("Transpose", [xs], perm=[1, 0, 2, 3])                             # [B, KV, L, D]
            xp = b.op("Expand", [b.op("Unsqueeze", [x_p, zero1]), b.op("Concat", [B1, b.const([1, 1, 1])], axis=0)])
            x = b.op("Concat", [xp, xs], axis=2)                                        # [B, KV, P+S+L, D]
            x = b.op("Pad", [x, pads(4, 2, pk_br), fzero], mode="constant")
            x = b.op("Expand", [b.op("Unsqueeze", [x, b.const([2])]), rep_shape5])      # [B, KV, rep, ., D]
            kvb.append(to16(b.op("Reshape", [x, b.const([0, H, -1, D])])))             # [B, H, ., D]
        out_b = b.op("MultiHeadAttention", [to16(qs), kvb[0], kvb[1], "", "", bias_br], "mha_branch",
                     domain=MS_DOMAIN, num_heads=H, scale=lay["scale"])
        out_b = b.op("Slice", [to32(out_b), zero1, L1, one1])                           # [B, L, H*D]
        out_b = b.op("Gather", [b.op("Reshape", [out_b, b.const([-1, hd])]), "slot_of"], axis=0)  # [R, H*D]
        o = b.op("Concat", [out_p, out_b], "attention", axis=0)                         # [T, H*D]
        o_mm[li].input[0] = o
        per_layer[id(o_mm[li])] = b.nodes

    nodes = list(shared)
    for n in g.node:
        nodes.extend(per_layer.get(id(n), []))
        nodes.append(n)
    # Drop what nothing reads any more (the plain attention's scores, softmaxes and masks).
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    keep.reverse()
    removed = len(nodes) - len(keep)
    del g.node[:]
    g.node.extend(keep)
    for t in [t for t in g.initializer if t.name not in needed]:
        g.initializer.remove(t)
    if not any(o.domain == MS_DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return {"layers": n_layers, "heads": H, "head_dim": D, "dtype": dtype, "removed_nodes": removed}


def save(m: onnx.ModelProto, path: Path) -> None:
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def readings(build: Path, path: Path, kv: dict, vocab: int, reference: Path | None = None) -> dict:
    """Max |dlogprob| against model.gpu.onnx or `reference` (onnxruntime CPU provider): a request of random tokens, and one of text."""
    import torch
    from export_onnx import INPUTS, packed_example, sess_run
    from gpu_graph import check

    reference = reference or build / SOURCE_GRAPH
    out = {"random_tokens": round(check(path, reference, vocab, kv), 6)}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(build / "tokenizer.json"))
    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
            "from 1887 to 1889.")
    branches = [" Question: Is the tower in Paris? Answer:", " Question: Who designed it? Answer:",
                " Question: When was it built? Answer:"]
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    ex = packed_example(tok.encode(text).ids, [tok.encode(b).ids for b in branches], vocab, empty)
    # The read-outs of real text: the common token "1" and the model's own likely next tokens.
    ref = sess_run(reference, INPUTS, ex)
    got = sess_run(path, INPUTS, ex)
    out["text"] = round(float(np.abs(got - ref).max()), 6)
    del torch
    return out


def compare_passes(a: Path, b: Path, kv: dict, vocab: int, passes: Path, cells: list[str]) -> float:
    """Max |dlogprob| between two graphs on the engine's recorded passes (onnxruntime CPU provider).

    Each graph computes its own keys for a pass's P continued tokens (as the engine would), then the pass;
    `cells` are names in `passes` (bench/gpu-check-passes.json), each optionally NAME:COUNT (its first COUNT).
    """
    import onnxruntime as ort
    from export_onnx import INPUTS, packed_example

    runs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (a, b)]
    recorded = json.loads(passes.read_text())["passes"]
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    worst = 0.0
    for cell in cells:
        name, _, count = cell.partition(":")
        for i, p in list(enumerate(recorded[name]))[: int(count) if count else None]:
            t0 = time.time()
            P = int(p["pastTokens"])
            out = []
            for s in runs:
                past = empty
                if P:
                    ids = p["inputIds"][:P]
                    ex = packed_example(ids, [ids[-1:]], vocab, empty)
                    past = s.run(["present_kv"], {n: x.numpy() for n, x in zip(INPUTS, ex)})[0]
                i64 = lambda k: np.asarray(p[k], dtype=np.int64)  # noqa: E731
                feeds = {"input_ids": i64("inputIds"), "position_ids": i64("positionIds"), "subtree_end": i64("subtreeEnd"),
                         "gather_idx": i64("gatherIdx"), "target_ids": i64("targetIds").reshape(int(p["rows"]), int(p["width"])),
                         "branch_slots": i64("branchSlots").reshape(int(p["branches"]), int(p["branchWidth"])),
                         "slot_of": i64("slotOf"), "past_kv": past}
                out.append(s.run(["logprobs", "present_kv"], feeds))
            d = float(np.abs(out[0][0] - out[1][0]).max())
            dk = float(np.abs(out[0][1] - out[1][1]).max())
            worst = max(worst, d)
            log(f"{name}#{i}: T {len(p['inputIds'])}, P {P}, {p['branches']} x {p['branchWidth']}: max |dlogprob| {d:.2e}, "
                f"max |dpresent_kv| {dk:.2e} ({time.time() - t0:.0f}s)")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, help="the build's folder: reads model.gpu.onnx, writes model.gpu16.*")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("--fp32-products", default="", help="comma-separated weight names whose products stay float32")
    ap.add_argument("--attention", choices=["fused", "plain"], default=None,
                    help="fused: each layer's attention as com.microsoft MultiHeadAttention (see fuse_attention); "
                         "plain: model.gpu.onnx's MatMul / Softmax ops. Default: fused, except for a build whose "
                         "manifest names attention of its own (sliding windows, soft caps, another scale), which "
                         "the fused node's tree mask and 1/sqrt(D) would drop: plain")
    ap.add_argument("--attention-dtype", choices=["float32", "float16"], default="float32",
                    help="with --attention fused: the MultiHeadAttention nodes' inputs and arithmetic")
    ap.add_argument("--out", type=Path, help="write the graph here instead of BUILD/model.gpu16.onnx "
                    "(its facts beside it, NAME.json), e.g. to compare before replacing the build's")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with model.gpu.onnx")
    ap.add_argument("--twin", type=Path, help="write --graph's float32 twin here instead (see the docstring)")
    ap.add_argument("--graph", type=Path, help="with --twin: the half graph")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"),
                    help="with --build: compare two graphs on the recorded passes (--passes, --cells) instead")
    ap.add_argument("--passes", type=Path, default=Path(__file__).parent.parent / "bench" / "gpu-check-passes.json")
    ap.add_argument("--cells", default="primary,small", help="with --compare: comma-separated cells, NAME[:COUNT]")
    args = ap.parse_args()
    t0 = time.time()

    if args.twin:
        if not args.graph:
            ap.error("--twin needs --graph")
        m = onnx.load(str(args.graph), load_external_data=True)
        n = twin(m)
        args.twin.parent.mkdir(parents=True, exist_ok=True)
        save(m, args.twin)
        log(f"wrote {args.twin} ({n} products in float32 on half values) in {time.time() - t0:.0f}s")
        return 0
    if not args.build:
        ap.error("--build is required")

    build: Path = args.build
    source = json.loads((build / "model.gpu.json").read_text())
    manifest = json.loads((build / "manifest.json").read_text())
    if args.compare:
        worst = compare_passes(*args.compare, source["kv"], int(manifest["vocab_size"]), args.passes, args.cells.split(","))
        log(f"max |dlogprob| over the passes: {worst:.2e}")
        return 0
    if source.get("build_hash") != manifest["build_hash"]:
        log(f"{build}/model.gpu.json is of build {source.get('build_hash')}, not {manifest['build_hash']}: write it again first")
        return 2
    if args.attention is None:
        args.attention = "plain" if manifest.get("attention") else "fused"
        if manifest.get("attention"):
            log(f"attention of its own ({manifest['attention']}): kept as model.gpu.onnx computes it")
    path = args.out or build / HALF_GRAPH
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"reading {build / SOURCE_GRAPH} ...")
    m = onnx.load(str(build / SOURCE_GRAPH), load_external_data=True)
    keep = {s for s in args.fp32_products.split(",") if s}
    attention: dict = {"form": "plain"}
    if args.attention == "fused":
        fused = fuse_attention(m, source["kv"], args.attention_dtype)
        attention = {"form": f"{MS_DOMAIN}.MultiHeadAttention", "dtype": args.attention_dtype,
                     "nodes": 2 * fused["layers"], "num_heads": fused["heads"], "kv_heads": source["kv"]["kv_heads"],
                     "padded_to": ATTENTION_ALIGN}
        log(f"attention fused: {2 * fused['layers']} MultiHeadAttention nodes ({args.attention_dtype}), "
            f"{fused['removed_nodes']} plain nodes dropped")
    counts = halve(m, args.dtype, keep)
    log(f"{counts['products']} products and {counts['gathers']} table in {args.dtype}, {counts['casts_in']} casts in "
        f"... {time.time() - t0:.0f}s")
    save(m, path)
    del m
    written = time.time() - t0
    size = path.with_name(path.name + ".data").stat().st_size + path.stat().st_size
    log(f"wrote {path} ({size / 2**30:.2f} GiB) in {written:.0f}s")

    facts = {
        "format": HALF_FORMAT,
        "build_hash": source["build_hash"],
        "dtype": args.dtype,
        "file": path.name,
        "source": SOURCE_GRAPH,
        "kv": source["kv"],
        "products": {k: counts[k] for k in ("products", "gathers", "kept_float32")},
        "attention": attention,
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "sha256": sha256_file(path)[:16],
        "bytes": size,
        "max_abs_logprob_vs_model_gpu_onnx": None,
        "compared_on": None,
    }
    if not args.no_check:
        vocab = int(manifest["vocab_size"])
        if args.dtype == "float16":
            facts["max_abs_logprob_vs_model_gpu_onnx"] = readings(build, path, source["kv"], vocab)
            facts["compared_on"] = "onnxruntime CPU provider, its float16 MatMul kernels"
            if args.attention == "fused":
                # The same graph with the plain attention: what the fused nodes change, on their own.
                import tempfile

                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                    plain = Path(tmp) / "plain.onnx"
                    m = onnx.load(str(build / SOURCE_GRAPH), load_external_data=True)
                    halve(m, args.dtype, keep)
                    save(m, plain)
                    del m
                    attention["max_abs_logprob_vs_plain_attention"] = readings(build, path, source["kv"], vocab, plain)
                log(f"vs the plain attention: max |dlogprob| {attention['max_abs_logprob_vs_plain_attention']}")
        else:
            import tempfile

            with tempfile.TemporaryDirectory(dir=build) as tmp:
                tw = Path(tmp) / "twin.onnx"
                m = onnx.load(str(path), load_external_data=True)
                twin(m)
                save(m, tw)
                del m
                facts["max_abs_logprob_vs_model_gpu_onnx"] = readings(build, tw, source["kv"], vocab)
            facts["compared_on"] = "onnxruntime CPU provider, the float32 twin (half values, float32 arithmetic)"
        log(f"vs {SOURCE_GRAPH}: max |dlogprob| {facts['max_abs_logprob_vs_model_gpu_onnx']} ({facts['compared_on']})")
    facts_file = path.with_suffix(".json")
    facts_file.write_text(json.dumps(facts, indent=2) + "\n")
    log(f"wrote {facts_file} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
