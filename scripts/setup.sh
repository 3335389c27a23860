#!/usr/bin/env bash
# Usage: scripts/setup.sh [--test] [BUILD_DIR]
#   (nothing)    what building tfe needs: the libraries, tfe-plan and examples/draft_loop (scripts/run.sh):
#                a C++ compiler, CMake, Ninja, yaml-cpp, fmt, OpenSSL, nlohmann-json, CLI11
#   --test       also what only the tests need: doctest, clang with libFuzzer, the linters shellcheck and
#                clang-format, Python safetensors and numpy
#   BUILD_DIR    then configures the full build, tests included, in BUILD_DIR (so it implies --test)
#
# Installs on a Debian machine what is missing, and only that; with nothing missing it calls no package
# manager, so a machine that has everything (a GPU machine without a package mirror) passes. The CUDA 13
# toolkit (NVRTC, cudart, cuBLASLt) comes from NVIDIA, not from here.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n "2,${1:-11}p" "$0" | sed 's/^# \{0,1\}//'; }
test_deps=
build_dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --test) test_deps=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "setup.sh: unknown option $1" >&2; usage 7 >&2; exit 2 ;;
    *) [ -z "$build_dir" ] || { echo "setup.sh: one build directory, not $build_dir and $1" >&2; exit 2; }
       build_dir=$1; shift ;;
  esac
done
[ -z "$build_dir" ] || test_deps=1

need_pkgs=()
# A header counts wherever the build finds it: the system, /usr/local, or the copies scripts/stage_deps.sh
# puts in .deps/ for a machine that lacks them.
have_header() { [ -e "/usr/include/$1" ] || [ -e "/usr/local/include/$1" ] || [ -e ".deps/include/$1" ]; }
command -v c++ >/dev/null        || need_pkgs+=(g++)
command -v cmake >/dev/null      || need_pkgs+=(cmake)
command -v ninja >/dev/null      || need_pkgs+=(ninja-build)
have_header yaml-cpp/yaml.h      || need_pkgs+=(libyaml-cpp-dev)
have_header fmt/format.h         || need_pkgs+=(libfmt-dev)
have_header openssl/sha.h        || need_pkgs+=(libssl-dev)
have_header nlohmann/json.hpp    || need_pkgs+=(nlohmann-json3-dev)
have_header CLI/CLI.hpp          || need_pkgs+=(libcli11-dev)
if [ -n "$test_deps" ]; then
  have_header doctest/doctest.h  || need_pkgs+=(doctest-dev)
  command -v shellcheck >/dev/null   || need_pkgs+=(shellcheck)
  command -v clang-format >/dev/null || need_pkgs+=(clang-format)
  # libFuzzer comes with clang and its runtime.
  command -v clang++ >/dev/null  || need_pkgs+=(clang)
  if ! compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a' >/dev/null; then
    need_pkgs+=(libclang-rt-dev)
  fi
fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
  SUDO=()
  [ "$(id -u)" = 0 ] || SUDO=(sudo)
  if ! command -v apt-get >/dev/null || { [ ${#SUDO[@]} -gt 0 ] && ! command -v sudo >/dev/null; }; then
    echo "setup.sh: missing ${need_pkgs[*]}, and no apt-get (or not root and no sudo) to install them" >&2
    exit 1
  fi
  echo "setup.sh: installing ${need_pkgs[*]}" >&2
  if ! "${SUDO[@]}" apt-get update -qq ||
     ! DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${need_pkgs[@]}" >/dev/null; then
    echo "setup.sh: apt-get could not install ${need_pkgs[*]} (no package mirror reachable?)" >&2
    exit 1
  fi
fi

if [ -n "$test_deps" ] && command -v python3 >/dev/null; then
  # A system Python may refuse pip (PEP 668, "externally managed"): then install for this user only.
  # safetensors: reading a .tfe from Python; nanobind and pytest: the Python package's build and suite.
  python3 -c 'import safetensors, numpy, nanobind, pytest' 2>/dev/null ||
    python3 -m pip install -q safetensors numpy nanobind pytest >/dev/null 2>&1 ||
    python3 -m pip install -q --user --break-system-packages safetensors numpy nanobind pytest >/dev/null 2>&1 ||
    echo "setup.sh: python safetensors/numpy/nanobind/pytest unavailable; the Python tests will report a skip" >&2
fi

if ! command -v nvcc >/dev/null && ! compgen -G '/usr/local/cuda*/include/nvrtc.h' >/dev/null &&
   [ ! -e /usr/include/nvrtc.h ]; then
  echo "setup.sh: no CUDA toolkit found; CMake needs CUDA 13.0 or newer (NVRTC, cudart, cuBLASLt)" >&2
fi

if [ -n "$build_dir" ] && [ ! -f "$build_dir/build.ninja" ]; then
  # shellcheck source=scripts/build_lib.sh
  . scripts/build_lib.sh
  configure_build . "$build_dir" >/dev/null
fi
