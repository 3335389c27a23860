#!/usr/bin/env bash
# Set-up (when needed), build, and every test that runs on this machine (CPU tests, fuzzers for a
# bounded time, and GPU tests when a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cmake --build build -j "$(nproc)"
# A hung test fails after 15 minutes instead of holding CI until its limit.
# Skipped tests (no GPU, no Python safetensors) are listed by ctest as "Skipped", not counted as passed.
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
scripts/fuzz.sh 30
