#!/usr/bin/env bash
# Compile-checks every kernel in kernels/*.cuh for sm_90 without a GPU:
#  1. nvcc, one generated translation unit per kernel (gemv, gemv_rope_kv: one per ROWS) instantiating TfeConfig-style
#     configs at the llama3-8b-eagle3 and tfe-two-stage shapes, both weight kinds, every epilogue,
#     ROWS 1, 2, 4, 8, 16, plus odd sizes that take the scalar tails. `-Xptxas -v` reports registers;
#     any spill or local-memory stack frame fails the check.
#  2. NVRTC, as the runtime compiles them: the sources by name (no file system), name expressions
#     `tfe::kernels::<kernel><TfeConfig>`, --std=c++17, sm_90.
# Usage: [JOBS=n] [VERBOSE=1] scripts/check_kernels.sh [work dir]   (default: build-kernels-check)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=${1:-build-kernels-check}
rm -rf "$work/tu"  # units of kernels since renamed or removed would fail the build
mkdir -p "$work/tu"
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=${NVCC:-$cuda/bin/nvcc}

# Configs: kernel -> list of (source, constants). One line per specialization: "kernel source K=V ...".
python3 - "$work/configs.txt" <<'EOF'
import glob, re, sys
lines = []
# Each kernel's constants in order, as its description declares them (TFE_KERNEL_CONSTANTS, kernels/*.h).
declared = {}
for path in glob.glob("kernels/*.h"):
    for m in re.finditer(r'TFE_KERNEL_CONSTANTS\(\s*\w+,\s*"(\w+)"([^)]*)\)', open(path).read()):
        declared[m.group(1)] = [c.strip() for c in m.group(2).split(",") if c.strip()]
def add(kernel, source, **c):
    if list(c) != declared.get(kernel):
        sys.exit(f"check_kernels.sh: {kernel} given {list(c)}; kernels/ declares {declared.get(kernel)}")
    lines.append(" ".join([kernel, source] + [f"{k}={v}" for k, v in c.items()]))

# llama3-8b-eagle3: H 4096, taps 3 x 4096, ffn 14336, 32/8 heads of 128, vocab 128256, draft 32000,
# window 511, ring 520. tfe-two-stage: 4 taps, window 128, ring 144, cand_k 64, lowrank 512, qk_norm.
for width, threads in [(4096, 256), (8192, 512), (100, 128)]:
    add("rmsnorm", "rmsnorm.cuh", WIDTH=width, THREADS=threads)
for hidden, threads in [(4096, 256), (64, 64), (100, 128)]:
    add("prepare_x", "prepare_x.cuh", HIDDEN=hidden, THREADS=threads)
for width, threads in [(4096, 256), (8192, 256), (12, 32)]:
    add("copy_rows", "copy_rows.cuh", WIDTH=width, THREADS=threads)
for ranks in [0, 1]:  # one specialization for every bucket, with and without first_ranks
    add("load_tables", "load_tables.cuh", RANKS=ranks)
for steps in [1, 8, 16]:
    add("store_outputs", "store_outputs.cuh", MAX_STEPS=steps)
gemv_shapes = [  # (K, N, epilogue): the linears of both presets, and tails
    (12288, 4096, 0), (16384, 4096, 0),  # fc: 3 or 4 taps
    (8192, 6144, 0),                     # wqkv
    (4096, 4096, 2),                     # wo + residual
    (4096, 14336, 3),                    # gate/up SwiGLU
    (14336, 4096, 2),                    # down + residual
    (4096, 32000, 4),                    # lm_head (top1 partials)
    (4096, 512, 0), (512, 32000, 1),     # lr_a, lr_b (f32 scores)
    (100, 37, 0), (72, 50, 3), (200, 33, 2), (40, 17, 1),  # K and N tails
    (64, 300, 4), (100, 5000, 4),        # top1 partials: tiny's narrow lm_head; K and column tails, not narrow
]
# TILED 1 (kernels/weight_layout.h) where the matrix has a tiled form: whole 16-row tiles, 64-byte K steps.
def tileable(k, n, weight):
    return n % 16 == 0 and (k * (1 if weight else 2)) % 64 == 0
for rows in [1, 2, 4, 8, 16]:
    for weight in [0, 1]:
        for k, n, epi in gemv_shapes:
            for cols in [16] if epi == 3 else [16, 32]:
                for tiled in [0, 1] if tileable(k, n, weight) else [0]:
                    add(f"gemv", "gemv.cuh", ROWS=rows, K=k, N=n, WEIGHT=weight, EPILOGUE=epi, COLS=cols, TILED=tiled)
# gemv_cluster: narrow outputs with K split over a cluster: two_stage's lr_a at the planner's split (4) and
# the most (8), every epilogue it takes, and a column tail (300 of 304) at a K that gives each CTA 2 steps.
for rows in [1, 2, 4, 8, 16]:
    for weight in [0, 1]:
        for k, n, epi, cs in [(4096, 512, 0, 4), (4096, 512, 0, 8), (4096, 512, 1, 4), (4096, 512, 2, 2),
                              (4096, 512, 4, 4), (2048, 300, 0, 2)]:
            for tiled in [0, 1] if tileable(k, n, weight) else [0]:
                add("gemv_cluster", "gemv.cuh", ROWS=rows, K=k, N=n, WEIGHT=weight, EPILOGUE=epi, COLS=16, TILED=tiled,
                    CSPLIT=cs)
# gemv_rope_kv: llama3's wqkv, tiny's (narrow: 128 columns), head_dim 64 and 256.
for rows in [1, 2, 4, 8, 16]:
    for weight in [0, 1]:
        for heads, kvh, hd, k, ring in [(32, 8, 128, 8192, 520), (4, 2, 16, 128, 24), (8, 8, 64, 1024, 520),
                                        (16, 2, 256, 4096, 1024)]:
            for cols in [16, 32]:
                for tiled in [0, 1] if tileable(k, (heads + 2 * kvh) * hd, weight) else [0]:
                    add("gemv_rope_kv", "gemv.cuh", ROWS=rows, K=k, WEIGHT=weight, COLS=cols, HEADS=heads,
                        KV_HEADS=kvh, HEAD_DIM=hd, RING=ring, TILED=tiled)
for heads, kvh, hd, ring in [(32, 8, 128, 520), (32, 8, 128, 144), (16, 2, 256, 1024), (8, 8, 64, 520), (4, 2, 16, 24)]:
    for qk in [0, 1]:
        for wq in [0, 1]:
            add("qk_rope_kv", "qk_rope_kv.cuh", HEADS=heads, KV_HEADS=kvh, HEAD_DIM=hd, QK_NORM=qk, RING=ring, WRITE_Q=wq)
for heads, kvh, hd, window, ring in [(32, 8, 128, 511, 520), (32, 8, 128, 128, 144), (16, 2, 256, 511, 1024),
                                     (8, 8, 64, 511, 520), (4, 2, 16, 15, 24), (12, 4, 96, 63, 80), (4, 2, 6, 31, 40)]:
    # SPLIT 1 and the planner's first split: the longest and shortest chunks; 4: llama3's at 16 streams.
    for split in sorted({1, min(4, (window + 8) // 8), min(8, (window + 8) // 8)}):
        add("ring_attention", "ring_attention.cuh", HEADS=heads, KV_HEADS=kvh, HEAD_DIM=hd, WINDOW=window, RING=ring,
            SPLIT=split)
# top1: the join of ceil(VOCAB / COLS) partials: 2000 / 1000 at a 32000-id draft vocabulary, up to 16384
# (more than 8 a thread), and fewer than its 256 threads.
for vocab, cols, steps in [(32000, 16, 8), (32000, 32, 8), (128256, 16, 8), (262144, 16, 16), (300, 16, 1),
                           (5000, 32, 16)]:
    add("top1", "top1.cuh", VOCAB=vocab, COLS=cols, MAX_STEPS=steps)
# ranked (first_ranks, step 1): 8 logits a thread kept in registers, over vocabularies of 300 to 262144.
for vocab, steps in [(32000, 8), (16384, 8), (128256, 8), (262144, 16), (300, 1), (5000, 16)]:
    add("ranked", "ranked.cuh", VOCAB=vocab, MAX_STEPS=steps)
# topk: the planner's splits (8 at 32000 scores with 8 keys a thread, 16 at 65536 and 32 at 131072, the most
# held in registers; one CTA a row, as below sm_90), keys read from the scores past 32 a thread (262144 / 8,
# 40000 / 1), scalar loads (5001; 1000 / 8 with one key a thread and empty CTAs), CAND_K 1 and 512.
for vocab, k, split in [(32000, 64, 8), (32000, 512, 8), (65536, 512, 8), (131072, 512, 8), (262144, 512, 8),
                        (40000, 64, 1), (5001, 300, 2), (1000, 300, 8), (300, 16, 1), (5000, 1, 2)]:
    add("topk", "topk.cuh", VOCAB=vocab, CAND_K=k, SPLIT=split)
for hidden, k in [(4096, 64), (8192, 512), (64, 16), (100, 5)]:
    for weight in [0, 1]:
        add("rescore", "rescore.cuh", HIDDEN=hidden, CAND_K=k, WEIGHT=weight, MAX_STEPS=8)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF

# 1. nvcc: group the configs into translation units (gemv split by ROWS so the units compile in parallel).
python3 - "$work/configs.txt" "$work/tu" <<'EOF'
import sys, collections, os
units = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kernel, source, *consts = line.split()
    key = kernel + ("_" + consts[0].lower().replace("=", "") if kernel.startswith("gemv") else "")
    units[key].append((kernel, source, consts))
for key, specs in units.items():
    out = []
    for source in sorted({s for _, s, _ in specs}):
        out.append(f'#include "{source}"')
    for i, (kernel, source, consts) in enumerate(specs):
        body = " ".join(f"static constexpr long long {c.split('=')[0]} = {c.split('=')[1]};" for c in consts)
        out.append(f"struct Cfg{i} {{ {body} }};  // {' '.join(consts)}")
        out.append(f"template __global__ void tfe::kernels::{kernel}<Cfg{i}>(const tfe::kernels::"
                   f"{''.join(w.capitalize() for w in kernel.split('_'))}Params);")
    open(os.path.join(sys.argv[2], key + ".cu"), "w").write("\n".join(out) + "\n")
EOF

status=0
# JOBS units at a time (default: one per core), so that a shared machine is not oversubscribed.
# shellcheck disable=SC2317  # called through xargs' bash -c below
compile_unit() {
  "$nvcc" -std=c++17 -arch=sm_90 -O3 -I"$root/kernels" -Xptxas -v -c "$1" -o "${1%.cu}.o" >"${1%.cu}.log" 2>&1 ||
    { echo "FAIL nvcc $(basename "$1")"; cat "${1%.cu}.log"; return 1; }
}
export -f compile_unit
export nvcc root
# shellcheck disable=SC2016  # $1 is the inner shell's argument
find "$work/tu" -name '*.cu' -print0 | xargs -0 -P "${JOBS:-$(nproc)}" -I{} bash -c 'compile_unit "$1"' _ {} || exit 1

# Registers and spills, per function (demangled names give the config).
cat "$work"/tu/*.log | awk '
  /Compiling entry function/ { fn = $0; sub(/.*function ./, "", fn); sub(/. for .*/, "", fn) }
  /bytes stack frame/ { stack = $0 ~ /^.*[^0-9]0 bytes stack frame/ ? 0 : 1;
                        spill = ($0 ~ / 0 bytes spill stores/ && $0 ~ / 0 bytes spill loads/) ? 0 : 1;
                        if (stack || spill) { bad = 1; print "SPILL/STACK " fn ": " $0 } }
  /Used [0-9]+ registers/ { n++; match($0, /Used [0-9]+ registers/); r = substr($0, RSTART + 5, RLENGTH - 15);
                            if (r + 0 > maxr) { maxr = r + 0; maxfn = fn } }
  END { printf "nvcc: %d kernels compiled, max %d registers (%s)\n", n, maxr, maxfn; exit bad }' || status=1
if [ -n "${VERBOSE:-}" ]; then
  cat "$work"/tu/*.log | grep -E "Compiling entry|Used [0-9]+ registers|stack frame" || true
fi

# 2. NVRTC: every config through the runtime's path (sources handed over by name, name expressions).
cat >"$work/nvrtc_check.cpp" <<'EOF'
// Compiles each "kernel source K=V ..." line of a config file with NVRTC as tfe's compiler does.
#include <nvrtc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string dir = argv[2], include = argv[3];
  std::vector<std::string> names, texts;
  // Every header of kernels/, as the build embeds them (kernels/CMakeLists.txt: the .cuh files and the .h
  // files they include; the host's .h files ride along unused).
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cuh" && entry.path().extension() != ".h") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    names.push_back(entry.path().filename().string());
    texts.push_back(ss.str());
  }
  std::vector<const char*> hn, ht;
  for (size_t i = 0; i < names.size(); ++i) hn.push_back(names[i].c_str()), ht.push_back(texts[i].c_str());
  std::ifstream cfgs(argv[1]);
  std::string line;
  int failed = 0, done = 0;
  while (std::getline(cfgs, line)) {
    std::istringstream ls(line);
    std::string kernel, source, kv, body;
    ls >> kernel >> source;
    while (ls >> kv) body += "static constexpr long long " + kv.substr(0, kv.find('=')) + " = " +
                             kv.substr(kv.find('=') + 1) + "; ";
    const std::string src = "#include \"" + source + "\"\nstruct TfeConfig { " + body + "};\n";
    const std::string expr = "tfe::kernels::" + kernel + "<TfeConfig>";
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, src.c_str(), "tfe_spec.cu", static_cast<int>(hn.size()), ht.data(), hn.data());
    nvrtcAddNameExpression(prog, expr.c_str());
    const std::string inc = "-I" + include;
    const char* opts[] = {"--std=c++17", "-arch=sm_90", inc.c_str(), "-default-device"};
    const nvrtcResult rc = nvrtcCompileProgram(prog, 4, opts);
    const char* lowered = nullptr;
    if (rc == NVRTC_SUCCESS) nvrtcGetLoweredName(prog, expr.c_str(), &lowered);
    if (rc != NVRTC_SUCCESS || !lowered) {
      size_t n = 0;
      nvrtcGetProgramLogSize(prog, &n);
      std::string log(n, '\0');
      nvrtcGetProgramLog(prog, log.data());
      std::printf("FAIL nvrtc %s\n%s\n", line.c_str(), log.c_str());
      ++failed;
    }
    ++done;
    nvrtcDestroyProgram(&prog);
  }
  std::printf("nvrtc: %d specializations compiled, %d failed\n", done - failed, failed);
  return failed ? 1 : 0;
}
EOF
g++ -std=c++17 -O1 -I"$cuda/include" "$work/nvrtc_check.cpp" -o "$work/nvrtc_check" -L"$cuda/lib64" -lnvrtc \
  -Wl,-rpath,"$cuda/lib64"
# A sample of the configs keeps this step short: every kernel, and gemv at ROWS 16 only.
grep -v '^gemv' "$work/configs.txt" >"$work/nvrtc_configs.txt"
grep '^gemv gemv.cuh ROWS=16 ' "$work/configs.txt" >>"$work/nvrtc_configs.txt"
"$work/nvrtc_check" "$work/nvrtc_configs.txt" "$root/kernels" "$cuda/include" || status=1
exit $status
