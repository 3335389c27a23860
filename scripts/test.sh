#!/usr/bin/env bash
# Set-up (when needed), build, and every test that runs on this machine (CPU tests, fuzzers for a
# bounded time, and GPU tests when a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/fuzz.sh 30
