#!/usr/bin/env bash
# The device check, on a lent GPU machine (or here, on llvmpipe and Debian's driver library). What
# bench/gpu-check-carry.sh put in .cache/device travels over several calls of the device tool, one folder
# a call (the tool carries 64 MiB a call): base/ (Node, onnxruntime-node, the Vulkan loader) and cuda-1/ ...
# cuda-N/ (onnxruntime-gpu's CUDA provider, in parts). The machine keeps what a call leaves in the work
# folder while it stays warm, so the steps that need the whole provider wait for its last part.
#   bash bench/gpu-check.sh [STEP ...]      default: all of them, in this order
#     graphs   a GPU graph (float32 products) and a CPU graph (W8A8) of random weights at GPU_CHECK_MODEL's
#              real shapes (scripts/gpu_graph.py --random; no weights travel)
#     webgpu   where WebGPU places the products (scripts/placement.mjs), and the engine's passes timed on it
#     cpu      the same passes on the CPU provider (the W8A8 graph the CPU serves)
#     peer     the same passes through PyTorch + transformers, bf16, SDPA attention (bench/gpu-peer.py)
#     half     the half-precision GPU graph (scripts/half_graph.py), from the float32 one
#     cuda     the provider's parts reassembled and sha256-checked, put beside onnxruntime-node's library,
#              NVIDIA's CUDA 13 libraries from this machine's Python (site-packages/nvidia/*/lib) on
#              LD_LIBRARY_PATH; placement and timing on the float32 graph and the half-precision one
# Every call ends with the table of all the lanes measured so far (bench/gpu-check.mjs): tokens per second
# per cell, each over the CPU's and over the peer's.
#   device:  graphs webgpu | cpu peer | half | cuda, one call each, carrying base, cuda-1, cuda-2, cuda-3
#            (bench/README.md, "The device check": the exact calls and their timeouts)
#   here:    the same four in a copy of the tree, with GPU_CHECK_MODEL=qwen2.5-coder-0.5b and few cells
#            (bench/README.md: the dry run)
# Figures go to stdout and, as JSON, to $OUT (or bench/out/).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${GPU_CHECK_MODEL:-qwen2.5-coder-1.5b}
CELLS=${GPU_CHECK_CELLS:-} # empty: every cell bench/gpu-check-passes.json records
RUNS=${GPU_CHECK_RUNS:-2}
CONCURRENT=${GPU_CHECK_CONCURRENT:-8}
OUTDIR=${OUT:-bench/out}
D=.cache/device
W=${GPU_CHECK_WORK:-/tmp/assay-gpu-check}
G=$W/$MODEL
R=$W/results-$MODEL
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(graphs webgpu cpu peer half cuda)
mkdir -p "$W" "$R" "$OUTDIR"
say() { echo "[gpu-check] $*" >&2; }
has() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
fresh() { say "$1: this machine has not kept the earlier calls' work (it was given back between calls?): start again from the first call (bench/README.md)"; exit 3; }
t0=$SECONDS

# Node and onnxruntime-node: carried (base/, unpacked once into the work folder), else this checkout's.
NODE=node
if [[ -f $D/base/node.xz && ! -x $W/node ]]; then
  xz -dc "$D/base/node.xz" >"$W/node.partial" && chmod +x "$W/node.partial" && mv "$W/node.partial" "$W/node"
  tar -xJf "$D/base/ort.tar.xz" -C "$W"
fi
if [[ -x $W/node ]]; then
  NODE=$W/node
  export ASSAY_ORT_DIR=$W
elif [[ ! -d node_modules/onnxruntime-node ]]; then
  fresh "no Node here"
fi
ORT_LIB=${ASSAY_ORT_DIR:-.}/node_modules/onnxruntime-node/bin/napi-v6/linux/x64
if has webgpu; then
  if ls "$D"/base/gl/*.deb >/dev/null 2>&1 && ! bash scripts/mesa-vulkan.sh --check 2>/dev/null && ! grep 'libvulkan\.so\.1' <<<"$(ldconfig -p)" >/dev/null; then
    for f in "$D"/base/gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [[ -f $nvidia_icd && -z ${VK_DRIVER_FILES:-} ]] && export VK_DRIVER_FILES=$nvidia_icd
fi
GPU=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed -n 1p || true)
export GPU_CHECK_GPU=${GPU:+${GPU%%,*}, driver $(cut -d, -f2 <<<"$GPU" | xargs)}
say "node $("$NODE" --version); model $MODEL; steps ${STEPS[*]}${GPU:+; $GPU}"

# The CUDA provider's parts: whatever this call carried joins those of earlier calls in the work folder.
mkdir -p "$W/parts"
for p in "$D"/cuda-*/; do
  [[ -d $p ]] || continue
  for f in "$p"*; do [[ -f $W/parts/${f##*/} ]] || cp "$f" "$W/parts/"; done
done
if [[ -f $W/parts/cuda.parts ]]; then
  n=$(cat "$W/parts/cuda.parts")
  say "the CUDA provider's parts here: $(find "$W/parts" -name 'cuda.tar.xz.*' | wc -l) of $n"
fi

PY=${ASSAY_PYTHON:-python3}
[[ -x .cache/pyenv/bin/python ]] && PY=.cache/pyenv/bin/python
# gpu-check.mjs over lanes ($1, comma-separated), with the environment the caller gives; its own table off.
lanes() {
  local status=0
  "$NODE" bench/gpu-check.mjs --graphs "$G" --lanes "$1" ${CELLS:+--cells "$CELLS"} --runs "$RUNS" --cpu-runs "${GPU_CHECK_CPU_RUNS:-1}" \
    --concurrent "$CONCURRENT" --budget-s "${GPU_CHECK_BUDGET_S:-60}" --results "$R" || status=$?
  ((status == 0)) || say "lanes $1: exit $status (the table says why)"
}
# Where a provider places the graph's nodes, in one line (scripts/placement.mjs).
placement() {
  local graph=$1 provider=$2 file=$W/placement-$2-${1%.onnx}.json
  "$NODE" scripts/placement.mjs "$G/$graph" "$provider" >"$file" || true
  "$NODE" -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const sum = (o) => Object.values(o ?? {}).reduce((a, b) => a + b, 0);
    const cpu = r.nodes.CPUExecutionProvider ?? {};
    const products = ["MatMul", "MatMulInteger", "MatMulNBits", "Gemm", "Softmax"].filter((k) => cpu[k]).map((k) => `${k} ${cpu[k]}`);
    const gpu = Object.entries(r.nodes).filter(([k]) => k !== "CPUExecutionProvider").map(([k, v]) => `${k} ${sum(v)}`);
    const head = `placement of ${require("path").basename(r.graph)} on ${r.provider}`;
    console.log(r.ok ? `${head}: ${gpu.join(", ")}, CPU ${sum(cpu)}; products on the CPU: ${products.join(", ") || "none"}` : `${head}: failed: ${r.summary ?? r.error}`);
  ' "$file"
}

if has graphs && [[ ! -f $G/model.gpu.json ]]; then
  say "building the graphs of random weights at $MODEL's shapes ..."
  PYTHONUNBUFFERED=1 "$PY" scripts/gpu_graph.py --random "$MODEL" --build "$G" >&2
  say "graphs ready at $((SECONDS - t0)) s"
fi
# What scripts/half_graph.py reads beside model.gpu.json: a random build has no build hash.
[[ -f $G/model.gpu.json && ! -f $G/manifest.json ]] && "$PY" -c '
import json, sys
sys.path.insert(0, "scripts")
from gpu_graph import SHAPES
print(json.dumps({"name": "random weights at " + sys.argv[1] + "'"'"'s shapes", "build_hash": None, "vocab_size": SHAPES[sys.argv[1]]["vocab_size"]}))
' "$MODEL" >"$G/manifest.json"
needs_graphs() { [[ -f $G/model.gpu.json ]] || fresh "no graphs in $G for the step $1"; }

if has webgpu; then
  needs_graphs webgpu
  placement model.gpu.onnx webgpu
  lanes webgpu
fi
if has cpu; then
  needs_graphs cpu
  lanes cpu
fi
if has peer; then
  say "the peer: PyTorch + transformers, bf16, SDPA ..."
  PYTHONUNBUFFERED=1 "$PY" bench/gpu-peer.py --model "$MODEL" ${CELLS:+--cells "$CELLS"} --runs "$RUNS" --concurrent "$CONCURRENT" --results "$R" \
    ${GPU_CHECK_PEER_DEVICE:+--device "$GPU_CHECK_PEER_DEVICE"} || say "the peer: exit $? (no peer row)"
fi
if has half; then
  needs_graphs half
  if [[ ! -f scripts/half_graph.py ]]; then
    say "no scripts/half_graph.py in this checkout: the CUDA step times the float32 graph alone"
  elif [[ ! -f $G/model.gpu16.onnx ]]; then
    say "building the half-precision GPU graph ..."
    PYTHONUNBUFFERED=1 "$PY" scripts/half_graph.py --build "$G" --no-check >&2 || say "scripts/half_graph.py: exit $? (no cuda-fp16 lane)"
  fi
fi
if has cuda; then
  needs_graphs cuda
  [[ -f $W/parts/cuda.parts ]] || fresh "none of the CUDA provider's parts is here"
  n=$(cat "$W/parts/cuda.parts")
  C=$W/cuda
  if [[ ! -f $C/ok ]]; then
    for ((k = 1; k <= n; k++)); do
      [[ -f $W/parts/cuda.tar.xz.$k ]] || fresh "part $k of the CUDA provider's $n is not here"
    done
    say "reassembling the CUDA provider from $n parts ..."
    rm -rf "$C" && mkdir -p "$C"
    for ((k = 1; k <= n; k++)); do cat "$W/parts/cuda.tar.xz.$k"; done >"$C/cuda.tar.xz"
    (cd "$C" && grep ' cuda\.tar\.xz$' "$W/parts/cuda.sha256" | sha256sum -c --quiet -) ||
      { say "FAILED: the reassembled archive's sha256 is not the one bench/gpu-check-carry.sh wrote"; exit 4; }
    xz -dc "$C/cuda.tar.xz" | tar -xf - -C "$C"
    (cd "$C" && grep -v ' cuda\.tar\.xz$' "$W/parts/cuda.sha256" | sha256sum -c -) >&2 ||
      { say "FAILED: an unpacked library's sha256 is not the one bench/gpu-check-carry.sh wrote"; exit 4; }
    rm "$C/cuda.tar.xz"
    touch "$C/ok"
  fi
  # onnxruntime opens its providers from its own library's folder.
  for f in libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so; do ln -sfn "$C/$f" "$ORT_LIB/$f"; done
  # NVIDIA's CUDA 13 libraries, as this machine's PyTorch cu130 has them (site-packages/nvidia/*/lib), unless named.
  if [[ -z ${GPU_CHECK_CUDA_LIBS:-} ]]; then
    GPU_CHECK_CUDA_LIBS=$(python3 - <<'EOF'
import glob, os, site
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except ImportError:
    pass
roots += [os.path.join(p, "nvidia") for p in site.getsitepackages() + [site.getusersitepackages()]]
dirs = []
for r in dict.fromkeys(os.path.realpath(x) for x in roots):
    for d in sorted(glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "*", "lib"))):
        if d not in dirs and glob.glob(os.path.join(d, "lib*.so*")):
            dirs.append(d)
print(":".join(dirs))
EOF
    )
  fi
  [[ -n $GPU_CHECK_CUDA_LIBS ]] || say "no site-packages/nvidia/*/lib in python3's paths: the provider will not find CUDA's libraries"
  say "CUDA's libraries from: ${GPU_CHECK_CUDA_LIBS//:/ }"
  cuda_lanes=cuda
  [[ -f $G/model.gpu16.onnx ]] && cuda_lanes=cuda,cuda-fp16
  (
    export LD_LIBRARY_PATH=$GPU_CHECK_CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    placement model.gpu.onnx cuda
    [[ -f $G/model.gpu16.onnx ]] && placement model.gpu16.onnx cuda
    lanes "$cuda_lanes"
  )
fi

"$NODE" bench/gpu-check.mjs --graphs "$G" --lanes '' --table --results "$R" ${CELLS:+--cells "$CELLS"} \
  --label "$MODEL, $(date -u +%Y-%m-%d), ${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo 'commit ?')}" --out "$OUTDIR/gpu-check-$MODEL.json" || true
say "done in $((SECONDS - t0)) s"
