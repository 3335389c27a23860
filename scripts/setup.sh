#!/usr/bin/env bash
# Installs what tfe needs on a fresh Debian machine (only what is missing) and configures the build.
# Usage: scripts/setup.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

need_pkgs=()
have_header() { [ -e "/usr/include/$1" ]; }
have_header yaml-cpp/yaml.h      || need_pkgs+=(libyaml-cpp-dev)
have_header fmt/format.h         || need_pkgs+=(libfmt-dev)
have_header doctest/doctest.h    || need_pkgs+=(doctest-dev)
have_header openssl/sha.h        || need_pkgs+=(libssl-dev)
have_header nlohmann/json.hpp    || need_pkgs+=(nlohmann-json3-dev)
have_header CLI/CLI.hpp          || need_pkgs+=(libcli11-dev)
command -v cmake >/dev/null      || need_pkgs+=(cmake)
command -v ninja >/dev/null      || need_pkgs+=(ninja-build)
# libFuzzer comes with clang and its runtime.
command -v clang++ >/dev/null    || need_pkgs+=(clang)
if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  need_pkgs+=(libclang-rt-dev)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Python packages used by the interoperability tests (reading a .tfe with the safetensors package).
if command -v python3 >/dev/null; then
  # A system Python may refuse pip (PEP 668, "externally managed"): then install for this user only.
  python3 -c 'import safetensors, numpy' 2>/dev/null || \
    python3 -m pip install -q safetensors numpy >/dev/null 2>&1 || \
    python3 -m pip install -q --user --break-system-packages safetensors numpy >/dev/null 2>&1 || \
    echo "setup: python safetensors/numpy unavailable; the interoperability test will report a skip" >&2
fi

if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
