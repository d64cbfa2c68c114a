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
    python scripts/half_graph.py --twin OUT.onnx --graph GRAPH.onnx   # a half graph's float32 twin

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


def save(m: onnx.ModelProto, path: Path) -> None:
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)


def readings(build: Path, path: Path, kv: dict, vocab: int) -> dict:
    """Max |dlogprob| against model.gpu.onnx (onnxruntime CPU provider): a request of random tokens, and one of text."""
    import torch
    from export_onnx import INPUTS, packed_example, sess_run
    from gpu_graph import check

    out = {"random_tokens": round(check(path, build / SOURCE_GRAPH, vocab, kv), 4)}
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
    ref = sess_run(build / SOURCE_GRAPH, INPUTS, ex)
    got = sess_run(path, INPUTS, ex)
    out["text"] = round(float(np.abs(got - ref).max()), 4)
    del torch
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, help="the build's folder: reads model.gpu.onnx, writes model.gpu16.*")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("--fp32-products", default="", help="comma-separated weight names whose products stay float32")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with model.gpu.onnx")
    ap.add_argument("--twin", type=Path, help="write --graph's float32 twin here instead (see the docstring)")
    ap.add_argument("--graph", type=Path, help="with --twin: the half graph")
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
    if source.get("build_hash") != manifest["build_hash"]:
        log(f"{build}/model.gpu.json is of build {source.get('build_hash')}, not {manifest['build_hash']}: write it again first")
        return 2
    path = build / HALF_GRAPH
    log(f"reading {build / SOURCE_GRAPH} ...")
    m = onnx.load(str(build / SOURCE_GRAPH), load_external_data=True)
    keep = {s for s in args.fp32_products.split(",") if s}
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
    (build / "model.gpu16.json").write_text(json.dumps(facts, indent=2) + "\n")
    log(f"wrote {build}/model.gpu16.json in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
