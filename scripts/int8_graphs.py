"""A W8A8 build's other graphs: the same integer products for other int8 kernels.

The W8A8 graph (`model.onnx`, w8a8.py) quantizes each token row to uint8 (zero point 128, values
1..255) and multiplies it by int8 weights (±127) with MatMulInteger, then DequantizeLinear turns
the int32 sums back into floats. Two kernels in onnxruntime do not run that graph as written:

- `u8u8` (`model.u8u8.onnx`): on a CPU without VNNI or AMX (AVX2, or AVX-512 without VNNI),
  onnxruntime's u8 × s8 kernels use VPMADDUBSW, which adds *pairs* of u8·s8 products into int16 with
  saturation: 2 × 255 × 127 overflows and the layer's product comes out wrong (measured on an AVX2
  AMD EPYC with onnxruntime 1.31 and onnxruntime-node 1.23.2: every entry of a 64 × 1536 × 256
  product off). Its u8 × u8 kernels widen to int16 before they multiply: exact on every x86 CPU. This
  graph stores the weights + 128 as uint8 with zero point 128.
- `s8s8` (`model.s8s8.onnx`): the CUDA execution provider registers MatMulInteger for int8 × int8
  only, and DequantizeLinear for int8 / uint8 inputs only (no int32). Under CUDA the W8A8 graph's
  products and their dequantization would fall back to the host CPU, with a copy each way around every
  one. This graph quantizes activations to int8 (zero point 0, values -127..127), multiplies them by
  the int8 weights without zero points, and scales the int32 sums with Cast + Mul: every quantized op
  has a CUDA kernel.

In every variant the integers multiplied are the same (r + 128 − 128 = r; (W + 128) − 128 = W) and
the int32 sums become floats the same way (float(y) × scale), so each computes exactly what
`model.onnx` computes where its kernel is exact: the same build, the same build hash, the same
calibration. The engine picks the file per machine (ASSAY_INT8_PRODUCTS, src/models/int8.ts).

    python scripts/int8_graphs.py --build models/cache/qwen2.5-coder-0.5b-instruct [--variant s8s8]
    python scripts/int8_graphs.py --selftest
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VARIANTS = {"u8u8": "model.u8u8.onnx", "s8s8": "model.s8s8.onnx"}
WEIGHT_ZERO_POINT = "w8a8_wzp"


def log(msg: str) -> None:
    print(f"[int8] {msg}", flush=True)


def _weights(g: onnx.GraphProto) -> tuple[dict[str, onnx.TensorProto], set[str]]:
    """Initializers by name, and the names read by anything but a MatMulInteger's weight input."""
    inits = {i.name: i for i in g.initializer}
    other_uses = {x for n in g.node for k, x in enumerate(n.input) if not (n.op_type == "MatMulInteger" and k == 1)}
    return inits, other_uses


def _int8_products(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMulIntegers of a W8A8 graph: (activations, int8 weight initializer, activation zero point)."""
    inits = {i.name: i for i in g.initializer}
    out = []
    for node in g.node:
        if node.op_type != "MatMulInteger":
            continue
        w = inits.get(node.input[1])
        if w is None or w.data_type != TensorProto.INT8:
            continue
        if len(node.input) != 3:
            raise SystemExit(f"{node.name}: expected inputs (A, B, a_zero_point), got {list(node.input)}")
        out.append(node)
    return out


def rewrite_u8u8(model: onnx.ModelProto) -> int:
    """Every MatMulInteger whose weights are an int8 initializer reads them as uint8 with zero point 128."""
    g = model.graph
    inits, other_uses = _weights(g)
    done: set[str] = set()
    nodes = _int8_products(g)
    for node in nodes:
        w = inits[node.input[1]]
        if w.name not in done:
            if w.name in other_uses:
                raise SystemExit(f"{w.name} is read by other nodes than MatMulInteger; not rewritten")
            shifted = (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8)
            w.CopyFrom(numpy_helper.from_array(shifted, w.name))
            done.add(w.name)
        node.input.append(WEIGHT_ZERO_POINT)
    if nodes:
        g.initializer.append(numpy_helper.from_array(np.array(128, dtype=np.uint8), WEIGHT_ZERO_POINT))
    return len(nodes)


def rewrite_s8s8(model: onnx.ModelProto) -> int:
    """Activations quantized to int8 (zero point 0), products int8 × int8, sums scaled by Cast + Mul."""
    g = model.graph
    producers = {o: n for n in g.node for o in n.output}
    nodes = _int8_products(g)
    products = {n.output[0] for n in nodes}
    zero_points: set[str] = set()
    for node in nodes:
        q = producers.get(node.input[0])
        if q is None or q.op_type != "QuantizeLinear" or len(q.input) != 3:
            raise SystemExit(f"{node.name}: its activations do not come from a QuantizeLinear with a zero point")
        zp = producers.get(q.input[2])
        if zp is None or zp.op_type != "ConstantOfShape":
            raise SystemExit(f"{q.name}: its zero point is not a ConstantOfShape")
        value = numpy_helper.to_array(next(a.t for a in zp.attribute if a.name == "value"))
        if zp.output[0] not in zero_points:
            if value.dtype != np.uint8 or int(value[0]) != 128:
                raise SystemExit(f"{zp.name}: expected a uint8 zero point of 128, got {value.dtype} {value}")
            del zp.attribute[:]
            zp.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.array([0], dtype=np.int8))))
            zero_points.add(zp.output[0])
        del node.input[2:]
    axes = "int8_s8s8_axes"
    out: list[onnx.NodeProto] = []
    column: dict[str, str] = {}
    scaled = 0
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in products:
            # DequantizeLinear's axis defaults to 1: the row scale must be on axis 0, said explicitly.
            if len(n.input) != 2 or next((a.i for a in n.attribute if a.name == "axis"), 1) != 0:
                raise SystemExit(f"{n.name}: expected DequantizeLinear(int32 sums, row scale) on axis 0")
            scaled += 1
            scale = n.input[1]
            if scale not in column:
                column[scale] = scale + "/column"
                out.append(helper.make_node("Unsqueeze", [scale, axes], [column[scale]]))
            out.append(helper.make_node("Cast", [n.input[0]], [n.output[0] + "/f32"], to=TensorProto.FLOAT))
            out.append(helper.make_node("Mul", [n.output[0] + "/f32", column[scale]], [n.output[0]]))
        else:
            out.append(n)
    if scaled != len(products):
        raise SystemExit(f"expected one DequantizeLinear per product ({len(products)})")
    del g.node[:]
    g.node.extend(out)
    g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), axes))
    # The activations' uint8 zero point, read by no node now.
    used = {x for n in g.node for x in n.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return len(nodes)


REWRITES = {"u8u8": rewrite_u8u8, "s8s8": rewrite_s8s8}


def cuda_kernel_gaps(model: onnx.ModelProto) -> list[str]:
    """Quantized ops that onnxruntime's CUDA provider has no kernel for (MatMulInteger: int8 × int8; DequantizeLinear: no int32)."""
    g = model.graph
    types = {i.name: i.data_type for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    gaps = []
    for n in g.node:
        if n.op_type == "MatMulInteger":
            a = producers.get(n.input[0])
            zp = producers.get(a.input[2]) if a is not None and a.op_type == "QuantizeLinear" and len(a.input) > 2 else None
            a_type = numpy_helper.to_array(next(x.t for x in zp.attribute if x.name == "value")).dtype if zp is not None else None
            if a_type != np.int8 or types.get(n.input[1]) != TensorProto.INT8 or len(n.input) > 2:
                gaps.append(f"{n.name or n.output[0]}: MatMulInteger not int8 x int8 without zero points")
        if n.op_type == "DequantizeLinear" and producers.get(n.input[0]) is not None and producers[n.input[0]].op_type == "MatMulInteger":
            gaps.append(f"{n.name or n.output[0]}: DequantizeLinear of int32 sums")
    return gaps


def check(build: Path, variant: Path) -> float:
    """Both graphs on the export's check text (a prefix and three branches): max |Δ log-prob| on this CPU."""
    import json

    import onnxruntime as ort
    from tokenizers import Tokenizer

    sys.path.insert(0, str(Path(__file__).parent))
    from export_onnx import INPUTS, packed_example

    tok = Tokenizer.from_file(str(build / "tokenizer.json"))
    manifest = json.loads((build / "manifest.json").read_text())
    kv = manifest["kv"]
    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
            "from 1887 to 1889.")
    branches = [" Question: Is the tower in Paris? Answer:", " Question: Who designed it? Answer:",
                " Question: When was it built? Answer:"]
    empty = np.zeros((2, kv["layers"], kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32)
    ex = packed_example(tok.encode(text, add_special_tokens=False).ids,
                        [tok.encode(b, add_special_tokens=False).ids for b in branches], manifest["vocab_size"], empty)
    feeds = {n: t.numpy() for n, t in zip(INPUTS, ex)}
    run = lambda f: ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(["logprobs"], feeds)[0]
    return float(np.abs(run(build / "model.onnx") - run(variant)).max())


def selftest() -> int:
    """A small two-layer float graph through w8a8.rewrite, then each variant, against the base graph's exact value.

    The reference is onnx's own evaluator (numpy, exact integer sums), so the check does not depend on
    this CPU's int8 kernels: u8 × s8 saturates without VNNI / AMX, and s8 × s8 is the CUDA graph.
    u8 × u8 also runs through onnxruntime here, where it is the CPU's exact graph.
    """
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    class DequantizeLinear(DequantizeLinear_19):
        """onnx's evaluator implements DequantizeLinear from opset 19; opset 13's is the same for int32 per-axis input."""

        op_domain = ""

        def _run(self, x, x_scale, x_zero_point=None, axis=1, **_):  # type: ignore[override]
            return super()._run(x, x_scale, x_zero_point, axis)

    sys.path.insert(0, str(Path(__file__).parent))
    from w8a8 import rewrite as w8a8

    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.normal(size=(256, 192)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(192, 96)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "selftest", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 96])], [w1, w2])
    base, n = w8a8(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    if n != 2:
        raise SystemExit(f"w8a8 rewrote {n} MatMuls, expected 2")
    # Rows of very different sizes: each row's own scale must carry through every variant.
    x = (rng.normal(size=(5, 256)) * np.array([[0.01], [1.0], [30.0], [1e3], [0.5]])).astype(np.float32)
    exact = lambda m: ReferenceEvaluator(m, new_ops=[DequantizeLinear]).run(None, {"x": x})[0]
    onnxruntime = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    ref = exact(base)
    scale = float(np.abs(ref).max())
    failed = False
    for name, fn in REWRITES.items():
        m = onnx.ModelProto()
        m.CopyFrom(base)
        if fn(m) != 2:
            raise SystemExit(f"{name}: expected 2 products rewritten")
        onnx.checker.check_model(m)
        runs = [("onnx reference", exact)] + ([("onnxruntime, this CPU", onnxruntime)] if name == "u8u8" else [])
        for how, run in runs:
            d = float(np.abs(run(m) - ref).max()) / scale
            log(f"selftest {name} ({how}): max |Δ| / max |y| against model.onnx's graph = {d:.3g}")
            failed |= d > 1e-6
        gaps = cuda_kernel_gaps(m)
        if name == "s8s8" and gaps:
            log(f"selftest s8s8: ops without a CUDA kernel: {gaps}")
            failed = True
    if not cuda_kernel_gaps(base):
        log("selftest: the W8A8 graph reported no CUDA kernel gaps: the check itself is wrong")
        failed = True
    return 4 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="an exported W8A8 build's folder (model.onnx, manifest.json)")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="u8u8")
    ap.add_argument("--no-check", action="store_true", help="skip running both graphs once")
    ap.add_argument("--selftest", action="store_true", help="check every rewrite on a small graph and exit")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.build is None:
        ap.error("--build is required")
    t0 = time.time()
    src = args.build / "model.onnx"
    name = VARIANTS[args.variant]
    out = args.build / name
    tmp = args.build / (name + ".partial")
    data = name + ".data"
    for stale in (tmp, args.build / (name + ".partial.data"), out, args.build / data):
        stale.unlink(missing_ok=True)
    m = onnx.load(str(src), load_external_data=True)
    n = REWRITES[args.variant](m)
    if n == 0:
        log(f"{src}: no int8 MatMulInteger weights; nothing to write")
        return 0
    if args.variant == "s8s8" and cuda_kernel_gaps(m):
        log(f"ops left without a CUDA kernel: {cuda_kernel_gaps(m)[:3]}")
        return 3
    log(f"{args.variant}: {n} MatMulInteger nodes rewritten ... {time.time() - t0:.0f}s")
    # The external data file is named for the final graph, so the rename below keeps the reference.
    onnx.save_model(m, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
    del m
    tmp.rename(out)
    if not args.no_check:
        d = check(args.build, out)
        log(f"{args.variant} vs u8 x s8 on this CPU: max |dlogprob| = {d:.3g} (0 where both kernels are exact; u8 x s8 needs VNNI / AMX)")
    log(f"wrote {out} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
