"""A W8A8 build's graph with its int8 weights stored as uint8 (zero point 128): `model.u8u8.onnx`.

The W8A8 graph (w8a8.py) multiplies uint8 activations (zero point 128, the whole 1..255 range) by
int8 weights (±127) with MatMulInteger. On a CPU with VNNI or AMX, onnxruntime's u8 × s8 kernels
add each product into int32: exact. On one without (AVX2 only, or AVX-512 without VNNI) they use
VPMADDUBSW, which adds *pairs* of u8·s8 products into int16 with saturation: 2 × 255 × 127 overflows,
and the layer's product comes out wrong (measured on an AVX2 AMD EPYC with onnxruntime 1.31 and
onnxruntime-node 1.23.2: every entry of a 64 × 1536 × 256 product off, by up to the size of the
product itself). The u8 × u8 kernels widen to int16 before they multiply: exact on every x86 CPU.

Since (W + 128) − 128 = W, this variant computes exactly what the u8 × s8 graph computes where that
one is exact: the same build, the same build hash, the same calibration. The engine picks the file
per machine (ASSAY_INT8_PRODUCTS, src/models/manifest.ts).

    python scripts/u8u8.py --build models/cache/qwen2.5-coder-0.5b-instruct
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

VARIANT = "model.u8u8.onnx"
ZERO_POINT = "w8a8_wzp"


def log(msg: str) -> None:
    print(f"[u8u8] {msg}", flush=True)


def rewrite(model: onnx.ModelProto) -> int:
    """Every MatMulInteger whose weights are an int8 initializer reads them as uint8 with zero point 128."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    # Weights read by anything else than a MatMulInteger's B input cannot change type.
    other_uses = {x for n in g.node for k, x in enumerate(n.input) if not (n.op_type == "MatMulInteger" and k == 1)}
    done: set[str] = set()
    count = 0
    for node in g.node:
        if node.op_type != "MatMulInteger":
            continue
        w = inits.get(node.input[1])
        if w is None or w.data_type != TensorProto.INT8:
            continue
        if len(node.input) != 3:
            raise SystemExit(f"{node.name}: expected inputs (A, B, a_zero_point), got {list(node.input)}")
        if w.name not in done:
            if w.name in other_uses:
                raise SystemExit(f"{w.name} is read by other nodes than MatMulInteger; not rewritten")
            shifted = (numpy_helper.to_array(w).astype(np.int16) + 128).astype(np.uint8)
            w.CopyFrom(numpy_helper.from_array(shifted, w.name))
            done.add(w.name)
        node.input.append(ZERO_POINT)
        count += 1
    g.initializer.append(numpy_helper.from_array(np.array(128, dtype=np.uint8), ZERO_POINT))
    return count


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="an exported W8A8 build's folder (model.onnx, manifest.json)")
    ap.add_argument("--no-check", action="store_true", help="skip running both graphs once")
    args = ap.parse_args()
    t0 = time.time()
    src = args.build / "model.onnx"
    out = args.build / VARIANT
    tmp = args.build / (VARIANT + ".partial")
    data = VARIANT + ".data"
    for stale in (tmp, args.build / (VARIANT + ".partial.data"), out, args.build / data):
        stale.unlink(missing_ok=True)
    m = onnx.load(str(src), load_external_data=True)
    n = rewrite(m)
    if n == 0:
        log(f"{src}: no int8 MatMulInteger weights; nothing to write")
        return 0
    log(f"{n} MatMulInteger nodes read uint8 weights ... {time.time() - t0:.0f}s")
    # The external data file is named for the final graph, so the rename below keeps the reference.
    onnx.save_model(m, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
    del m
    tmp.rename(out)
    if not args.no_check:
        d = check(args.build, out)
        log(f"u8 x u8 vs u8 x s8 on this CPU: max |dlogprob| = {d:.3g} (0 where the u8 x s8 kernel is exact: VNNI / AMX)")
    log(f"wrote {out} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
