#!/usr/bin/env bash
# Whether a change to kernels/ changes machine code: compiles the same specializations of one kernel from
# the kernels/ of a base revision and of the working tree for sm_90 (nvcc -cubin, no GPU needed) and
# compares each function's code (its ELF .text section) byte for byte. A restructuring meant to leave a
# kernel as it was is checked so before any device time goes into measuring it.
#
# Usage: scripts/sass_diff.sh BASE_REV [KERNEL] [CONFIGS]
#   KERNEL: default gemv. CONFIGS: the "kernel source K=V ..." lines of scripts/check_kernels.sh (default
#   build-kernels-check/configs.txt, which that script writes; run it first).
# Prints how many functions are identical and names those that differ; exits 1 if any differ.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/sass_diff.sh BASE_REV [KERNEL] [CONFIGS]" >&2; exit 2; }
base=$1
kernel=${2:-gemv}
configs=${3:-build-kernels-check/configs.txt}
[ -s "$configs" ] || { echo "sass_diff: no $configs; run scripts/check_kernels.sh first" >&2; exit 2; }
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base"
git archive "$base" kernels | tar -x -C "$work/base"

# One translation unit with every specialization of the kernel in the configs.
python3 - "$configs" "$kernel" "$work/unit.cu" <<'EOF'
import sys
configs, kernel, out = sys.argv[1:]
specs = [line.split() for line in open(configs) if line.split()[:1] == [kernel]]
if not specs:
    sys.exit(f"sass_diff: no `{kernel}` line in {configs}")
params = "".join(w.capitalize() for w in kernel.split("_")) + "Params"
lines = [f'#include "{specs[0][1]}"']
for i, (_, _, *consts) in enumerate(specs):
    body = " ".join(f"static constexpr long long {c.split('=')[0]} = {c.split('=')[1]};" for c in consts)
    lines.append(f"struct Cfg{i} {{ {body} }};  // {' '.join(consts)}")
    lines.append(f"template __global__ void tfe::kernels::{kernel}<Cfg{i}>(const tfe::kernels::{params});")
open(out, "w").write("\n".join(lines) + "\n")
EOF

"$nvcc" -std=c++17 -arch=sm_90 -O3 -I"$work/base/kernels" -cubin "$work/unit.cu" -o "$work/base.cubin"
"$nvcc" -std=c++17 -arch=sm_90 -O3 -I"$PWD/kernels" -cubin "$work/unit.cu" -o "$work/tree.cubin"

# The .text section of each function, read from the ELF headers of both cubins.
python3 - "$work/base.cubin" "$work/tree.cubin" "$work/unit.cu" <<'EOF'
import re, struct, sys

def texts(path):
    d = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    entsize, count, names_at = struct.unpack_from("<HHH", d, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * entsize) for i in range(count)]
    names = sections[names_at]
    def name(off):
        s = d[names[4] + off:]
        return s[:s.index(b"\0")].decode()
    return {name(s[0])[len(".text."):]: d[s[4]:s[4] + s[5]] for s in sections if name(s[0]).startswith(".text.")}

base, tree = texts(sys.argv[1]), texts(sys.argv[2])
configs = dict(re.findall(r"struct (Cfg\d+) \{.*\};  // (.*)", open(sys.argv[3]).read()))
differ = sorted(f for f in base if base[f] != tree.get(f))
missing = sorted(set(base) ^ set(tree))
print(f"sass_diff: {len(base)} functions, {len(base) - len(differ)} identical, {len(differ)} differ")
for f in differ:
    cfg = re.search(r"Cfg\d+", f)
    size = f"{len(base[f])} -> {len(tree[f])} bytes" if f in tree else "missing"
    print(f"  {configs.get(cfg.group(0), f) if cfg else f}: {size}")
for f in missing:
    print(f"  only in one build: {f}")
sys.exit(1 if differ or missing else 0)
EOF
