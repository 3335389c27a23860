#!/usr/bin/env bash
# Where a GEMV's time goes, part by part, on a machine with a CUDA device: examples/bench_gemv times
# kernels/gemv.cuh as it is and variants of it (`--source`, no rebuild) that each leave one part of the ring
# loop out. The variants' outputs are wrong by design (their checks print FAIL); only their times mean
# something. Each variant keeps the kernel's launch (grid, block, dynamic shared memory), so the CTAs sit
# where the kept kernel's do.
#   kept       kernels/gemv.cuh
#   no_x       the ring's x chunks zero-filled (cp.async of 0 source bytes): no x read from L2, the
#              ring's shape, copies and shared-memory reads unchanged
#   no_x_deep  in the dynamic-ring shapes (two weight tiles; FP8 above 8 rows), x never loaded and the
#              ring's shared memory given to weights alone, up to 6 stages: what more weights in flight buy
#   no_mma     the ring's steps compute nothing (their chunks are still read from shared memory): the
#              loads alone
#   no_x_no_mma  both: the weights' copies into the ring and their reads back alone, the stream this
#              grid gets with nothing else in a warp's way
#   no_widen   FP8 chunks fed to the mmas as they are, not widened to bf16, and x not scaled (the mmas
#              kept): what the e4m3 -> bf16 widening costs (bf16 shapes are the kept kernel)
# Usage: scripts/gemv_parts.sh [BUILD_DIR] [bench_gemv options]
#   (default build-gpu; options default to --rows 16 --weights fp8 --cols 32)
# Builds bench_gemv in BUILD_DIR (configured like scripts/gpu_test.sh) and prints, per variant, its shapes'
# times and their sum. BENCHMARKS.md "What is left" (FP8 at 16 rows) quotes a run of it.
#        scripts/gemv_parts.sh --generate DIR
# Only writes the variants into DIR (no GPU needed): a CPU test compiles them, so that a change to
# kernels/gemv.cuh that the edits no longer fit is found by the tests, not on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh

# Each variant is kernels/gemv.cuh with text replaced; a pattern that is not found exactly once means the
# kernel changed under this script, which then stops rather than time the kept kernel under a wrong name.
generate() {
  python3 - kernels/gemv.cuh "$1" <<'EOF'
import sys
src, work = sys.argv[1], sys.argv[2]
kept = open(src).read()

def variant(name, edits):
    s = kept
    for old, new in edits:
        if s.count(old) != 1:
            sys.exit(f"gemv_parts: variant {name}: pattern found {s.count(old)} times, not once: {old[:70]!r}")
        s = s.replace(old, new)
    open(f"{work}/{name}.cuh", "w").write(s)

x_copy = ("copy_async_16<true>(dst + (S::W_SLOTS + n * S::XCHUNKS + c) * SLOT_BYTES, in ? xrow[n] + xat : x,\n"
          "                                  in ? 16u : 0u);")
variant("no_x", [(x_copy, x_copy.replace("in ? 16u : 0u", "0u"))])

x_ring = "static constexpr bool X_RING = BUDGET"
stages = "static constexpr int STAGES_WANTED = MT == 1 || DYNAMIC ? 3 : 2;"
load_x = "xc[n][c] = xrow[n] ? load_chunk"
variant("no_x_deep", [(x_ring, "static constexpr bool X_RING = !DYNAMIC && BUDGET"),
                      (stages, "static constexpr int STAGES_WANTED = DYNAMIC ? 6 : MT == 1 ? 3 : 2;"),
                      (load_x, "xc[n][c] = xrow[n] && !S::DYNAMIC ? load_chunk")])

# The chunks read from the ring are folded into one accumulator so that their loads stay in the code.
step = "        gemv_step<S, W>(acc, wc, xr);\n      } else {"
no_mma = (step, "        acc[0][0][0] += __uint_as_float(wc[0][0].x ^ wc[S::MT - 1][1].y ^ xr[0][0].x ^\n"
                "                                        xr[S::NT - 1][S::XCHUNKS - 1].z);\n"
                "      } else {")
variant("no_mma", [no_mma])
variant("no_x_no_mma", [(x_copy, x_copy.replace("in ? 16u : 0u", "0u")), no_mma])

# Both ways to widen left out, and x's scaling by 2^64 that goes with the bit placement (gemv_step).
widen = ("      if constexpr (W == Widen::bits) {\n"
         "        fp8x4_widen(in[i], out[2 * i], out[2 * i + 1]);\n"
         "      } else {\n"
         "        out[2 * i] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] & 0xffffu));\n"
         "        out[2 * i + 1] = fp8x2_to_bf16x2(static_cast<unsigned short>(in[i] >> 16));\n"
         "      }\n")
x_scale = "  if constexpr (S::FP8 && W == Widen::bits) {\n    // x times 2^64"
variant("no_widen", [(widen, "      out[2 * i] = in[i];\n      out[2 * i + 1] = in[i] >> 16;\n"),
                     (x_scale, "  if constexpr (false) {\n    // x times 2^64")])
EOF
}

if [ "${1:-}" = --generate ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/gemv_parts.sh --generate DIR" >&2; exit 2; }
  mkdir -p "$2"
  generate "$2"
  exit 0
fi

build=${1:-build-gpu}
shift || true
opts=("$@")
[ ${#opts[@]} -gt 0 ] || opts=(--rows 16 --weights fp8 --cols 32)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
generate "$work"

configure_build . "$build" >/dev/null
cmake --build "$build" --target bench_gemv >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }

for v in kept no_x no_x_deep no_mma no_x_no_mma no_widen; do
  source_opt=()
  [ "$v" = kept ] || source_opt=(--source "gemv.cuh=$work/$v.cuh")
  echo "== $v"
  # A variant's checks fail by design (bench_gemv exits 1) and its times still count; any other status
  # (it did not run, or crashed) stops the script.
  rc=0
  "$build/examples/bench_gemv" "${opts[@]}" --label "$v" "${source_opt[@]}" >"$work/$v.log" 2>&1 || rc=$?
  if [ "$rc" -gt 1 ] || { [ "$v" = kept ] && [ "$rc" -ne 0 ]; }; then
    tail -20 "$work/$v.log"
    echo "gemv_parts: bench_gemv exited $rc for $v" >&2
    exit 1
  fi
  awk '/^[a-z_]+ +(bf16|fp8) / { print "  " $1, $2, "rows", $3, "cols", $4, $5, "us" }
       /the linears summed/ { sum = 1 }
       sum && /^ +(bf16|fp8) / { print "  sum", $1, "rows", $2, "cols", $3, $4, "us, floor", $5 }' "$work/$v.log"
done
