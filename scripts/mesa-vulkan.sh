#!/usr/bin/env bash
# A Vulkan device for the WebGPU provider on a machine without a GPU: Mesa's llvmpipe, which runs the
# shaders on the CPU. Dawn (onnxruntime-node's WebGPU) refuses Debian bookworm's Mesa 22.3 ("Vulkan
# shaderUniform*ArrayDynamicIndexing required") and accepts Mesa 25 from bookworm-backports.
#   bash scripts/mesa-vulkan.sh           does nothing where a Mesa of 25 or later is installed; installs it
#                                         from Debian's packages where it can (root, apt); otherwise says
#                                         what to run and exits 1. Run by .ci/run.
#   bash scripts/mesa-vulkan.sh --check   only the exit status: 0 where it is there, 1 (and why) where not;
#                                         installs nothing. For callers that only need to know.
#   bash scripts/mesa-vulkan.sh --mirror  prints the Debian mirror the machine's apt uses (scripts/cuda-provider.mjs
#                                         fetches Debian's libcuda1 from it); empty where there is none.
# The backports source it adds takes its mirror from the machine's own apt configuration.
set -euo pipefail

say() { echo "[mesa-vulkan] $*" >&2; }

# Every reader here reads its input to the end: a `grep -q` that exits at the first match would kill
# ldconfig with SIGPIPE mid-listing, and pipefail would turn that into a "missing" by chance.
have() {
  local v listing
  v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  [[ -n "$v" ]] && dpkg --compare-versions "$v" ge 25 || return 1
  listing=$(ldconfig -p) || return 1
  grep 'libvulkan\.so\.1' <<<"$listing" >/dev/null
}

# The first Debian mirror the machine's apt already uses: deb822 sources first, then the one-line format.
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f"
  done
  [[ -f /etc/apt/sources.list ]] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\// && $i !~ /security/) { print $i; exit } }' /etc/apt/sources.list
  return 0
}

if [[ ${1:-} == --mirror ]]; then
  mirror | sed -n 1p
  exit 0
fi
if have; then exit 0; fi
if [[ ${1:-} == --check ]]; then
  say "no Mesa >= 25 Vulkan driver (mesa-vulkan-drivers >= 25 and libvulkan.so.1); bash $0 installs it"
  exit 1
fi

codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [[ $(id -u) -ne 0 || ! -x /usr/bin/apt-get || "$codename" != "bookworm" ]]; then
  say "no Mesa >= 25 Vulkan driver; the WebGPU tests need one. On Debian bookworm, as root:"
  say "  $0   (adds bookworm-backports, then apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1)"
  exit 1
fi
say "installing Mesa's Vulkan driver (llvmpipe) from bookworm-backports ..."
configured=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null || true)
if ! grep 'bookworm-backports' <<<"$configured" >/dev/null; then
  uri=$(mirror | sed -n 1p)
  [[ -n $uri ]] || { say "no Debian mirror in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources to add bookworm-backports from"; exit 1; }
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" >/etc/apt/sources.list.d/assay-bookworm-backports.sources
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q -t bookworm-backports mesa-vulkan-drivers libvulkan1 >&2
have || { say "installed, but no Mesa >= 25 Vulkan driver is visible"; exit 1; }
say "done"
