#!/usr/bin/env bash
# A Vulkan device for the WebGPU provider on a machine without a GPU: Mesa's llvmpipe, which runs the
# shaders on the CPU. Dawn (onnxruntime-node's WebGPU) refuses Debian bookworm's Mesa 22.3 ("Vulkan
# shaderUniform*ArrayDynamicIndexing required") and accepts Mesa 25 from bookworm-backports.
# Does nothing where a Mesa of 25 or later is installed; installs it from Debian's packages where it can
# (root, apt); otherwise says what to run and exits 1. Run by .ci/run and by the bootstrap of `npm test`.
set -euo pipefail

have() {
  local v
  v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  [[ -n "$v" ]] && dpkg --compare-versions "$v" ge 25 && ldconfig -p | grep -q 'libvulkan\.so\.1'
}

if have; then exit 0; fi
say() { echo "[mesa-vulkan] $*" >&2; }
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [[ $(id -u) -ne 0 || ! -x /usr/bin/apt-get || "$codename" != "bookworm" ]]; then
  say "no Mesa >= 25 Vulkan driver; the WebGPU tests need one. On Debian bookworm, as root:"
  say "  $0   (adds bookworm-backports, then apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1)"
  exit 1
fi
say "installing Mesa's Vulkan driver (llvmpipe) from bookworm-backports ..."
src=/etc/apt/sources.list.d/assay-bookworm-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$src"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q -t bookworm-backports mesa-vulkan-drivers libvulkan1 >&2
have || { say "installed, but no Mesa >= 25 Vulkan driver is visible"; exit 1; }
say "done"
