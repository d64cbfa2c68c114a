"""Which layouts of an attention row keep onnxruntime's CPU kernels bit for bit (docs/experiments/batching.md).

A softmax row followed by the product with the values, [H, M, K] x [H, K, D], computed once as is and
again with masked keys (-inf, probability 0) put before or after the row's own keys. Prints the largest
difference of the output and of the own keys' probabilities. 0 means the layout keeps the arithmetic:
what the batch graph (scripts/batch_graph.py) relies on.

    .cache/pyenv/bin/python bench/kernel-exactness.py
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def session() -> ort.InferenceSession:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["H", "M", "K"])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, ["H", "K", "D"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "row", [x, v], [y, p]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def main() -> None:
    s = session()
    rng = np.random.default_rng(0)
    H, M, D = 12, 70, 64
    layouts = [("after 300", 0, 300), ("before 5", 5, 0), ("before 37", 37, 0), ("before 16", 16, 0), ("before 64", 64, 0),
               ("before 100, after 200", 100, 200), ("before 256", 256, 0), ("before 512", 512, 0)]
    print("| own keys K | " + " | ".join(name for name, _, _ in layouts) + " |")
    print("|---|" + "---|" * len(layouts))
    for K in [37, 70, 150, 300]:
        x = rng.normal(size=(H, M, K)).astype(np.float32) * 3
        v = rng.normal(size=(H, K, D)).astype(np.float32)
        y0, p0 = s.run(None, {"x": x, "v": v})
        cells = []
        for _, pre, post in layouts:
            xx = np.concatenate([np.full((H, M, pre), -np.inf, np.float32), x, np.full((H, M, post), -np.inf, np.float32)], -1)
            vv = np.concatenate([rng.normal(size=(H, pre, D)).astype(np.float32), v, rng.normal(size=(H, post, D)).astype(np.float32)], 1)
            y1, p1 = s.run(None, {"x": xx, "v": vv})
            cells.append(f"{np.abs(p1[..., pre:pre + K] - p0).max():.0e} / {np.abs(y1 - y0).max():.0e}")
        print(f"| {K} | " + " | ".join(cells) + " |")
    print(f"\n(softmax probabilities / output; onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main()
