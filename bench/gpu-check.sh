#!/usr/bin/env bash
# The device check: one command, on a lent GPU machine (or here, on llvmpipe). It unpacks what
# bench/gpu-check-carry.sh put in .cache/device (Node, onnxruntime-node, the Vulkan loader), builds a
# GPU graph and a CPU graph of random weights at a shipped model's real shapes (scripts/gpu_graph.py
# --random; no weights travel), shows where the GPU provider places the products
# (scripts/placement.mjs), and times the engine's packed passes (bench/gpu-check.mjs) on each provider.
#   device:  run(command="bash bench/gpu-check.sh", carry=[".cache/device"])
#   here:    GPU_CHECK_MODEL=qwen2.5-coder-0.5b GPU_CHECK_CELLS=primary,small GPU_CHECK_RUNS=1 GPU_CHECK_CONCURRENT=2 bash bench/gpu-check.sh
# Figures go to stdout and, as JSON, to $OUT (or bench/out/).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${GPU_CHECK_MODEL:-qwen2.5-coder-1.5b}
CELLS=${GPU_CHECK_CELLS:-primary,wide,small}
RUNS=${GPU_CHECK_RUNS:-3}
CONCURRENT=${GPU_CHECK_CONCURRENT:-8}
PROVIDERS=${GPU_CHECK_PROVIDERS:-webgpu,cpu}
OUTDIR=${OUT:-bench/out}
D=.cache/device
W=${GPU_CHECK_WORK:-/tmp/assay-gpu-check}
mkdir -p "$W" "$OUTDIR"
say() { echo "[gpu-check] $*" >&2; }
t0=$SECONDS

NODE=node
if [[ -f $D/node.xz ]]; then
  xz -dc "$D/node.xz" >"$W/node" && chmod +x "$W/node" && NODE=$W/node
  tar -xJf "$D/ort.tar.xz" -C "$W" && export ASSAY_ORT_DIR=$W
fi
if ls "$D"/gl/*.deb >/dev/null 2>&1 && ! bash scripts/mesa-vulkan.sh --check 2>/dev/null && ! grep 'libvulkan\.so\.1' <<<"$(ldconfig -p)" >/dev/null; then
  for f in "$D"/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[[ -f $nvidia_icd && -z ${VK_DRIVER_FILES:-} ]] && export VK_DRIVER_FILES=$nvidia_icd
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
say "node $("$NODE" --version); model $MODEL; cells $CELLS; providers $PROVIDERS"

PY=${ASSAY_PYTHON:-python3}
[[ -x .cache/pyenv/bin/python ]] && PY=.cache/pyenv/bin/python
if [[ ! -f $W/$MODEL/model.gpu.json ]]; then
  say "building the graphs of random weights at $MODEL's shapes ..."
  PYTHONUNBUFFERED=1 "$PY" scripts/gpu_graph.py --random "$MODEL" --build "$W/$MODEL" >&2
fi
say "graphs ready at $((SECONDS - t0)) s"

for p in ${PROVIDERS//,/ }; do
  [[ $p == cpu ]] && continue
  "$NODE" scripts/placement.mjs "$W/$MODEL/model.gpu.onnx" "$p" >"$W/placement-$p.json" || true
  "$NODE" -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const sum = (o) => Object.values(o ?? {}).reduce((a, b) => a + b, 0);
    const cpu = r.nodes.CPUExecutionProvider ?? {};
    const products = ["MatMul", "MatMulInteger", "MatMulNBits", "Gemm", "Softmax"].filter((k) => cpu[k]).map((k) => `${k} ${cpu[k]}`);
    const gpu = Object.entries(r.nodes).filter(([k]) => k !== "CPUExecutionProvider").map(([k, v]) => `${k} ${sum(v)}`);
    console.log(r.ok ? `placement on ${r.provider}: ${gpu.join(", ")}, CPU ${sum(cpu)}; products on the CPU: ${products.join(", ") || "none"}` : `placement on ${r.provider}: failed: ${r.error}`);
  ' "$W/placement-$p.json"
done

"$NODE" bench/gpu-check.mjs --graphs "$W/$MODEL" --providers "$PROVIDERS" --cells "$CELLS" --runs "$RUNS" --cpu-runs "${GPU_CHECK_CPU_RUNS:-1}" --concurrent "$CONCURRENT" \
  --label "$MODEL, $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null || echo '?')" --out "$OUTDIR/gpu-check-$MODEL.json"
say "done in $((SECONDS - t0)) s"
