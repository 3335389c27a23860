#!/usr/bin/env bash
# Several changes measured in one device call: each PATCH (default: every docs/unmeasured/*.patch) applied to
# its own copy of this tree, every copy built at once beside this tree's build, each copy's GPU tests, then
# one scripts/ab.sh of this tree (`base`) against every copy that built and passed, alternated. Where
# scripts/ab_change.sh measures a change this tree holds, this measures changes it does not hold yet.
#
# Usage: scripts/ab_patches.sh [BUILD_DIR] [PATCH ...]   (default build-gpu)
# A setting is named after its patch file (docs/unmeasured/prefetch_next_embedding.patch ->
# prefetch_next_embedding), or, where NAME.settings lies beside the patch, one setting per line of it
# (SETTING=tfe-bench options, run as NAME_SETTING).
# Environment: OUT (default out/ab_patches): per patch NAME/ (patch.log, build.log, the tests' logs) and
# ab/; AB_PATCHES_DIR (default /tmp/ab_patches) holds the copies, NAME/ each, and each one's verdict;
# AB_PATCHES_TESTS: `quick` (scripts/gpu_test_quick.sh, the default), `full` (scripts/gpu_test.sh) or
# `none`; a copy's tests start as soon as it is built, all of them at once on the one GPU.
# AB_PATCHES_STAGE: `all` (the default), `copies` (only make the copies, no GPU needed: a check that every
# patch applies, or copies to carry to a machine that has neither patch nor git), `tests` (build and test
# the copies, and stop) or `ab` (measure the copies that an earlier `tests` call on this machine built and
# passed): two calls where one would run past a call's time limit. `all` and `tests` reuse a copy that a
# `copies` run made from the same patch (NAME.applied holds the patch's sha256), else make it anew: run
# `copies` again after the tree changes. AB_PRESETS, AB_STREAMS, AB_ROUNDS, AB_ITERS, AB_STEPS as for
# scripts/ab.sh. Drafts that differ from base are listed, not failed on (a change may move a confidence's
# last bits on purpose): read ab.sh's last line.
# The last lines: a verdict per patch and ab.sh's table. The exit status is 0 only when every patch
# applied, built and passed its tests, and every run of ab.sh succeeded.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/build_lib.sh
. scripts/build_lib.sh
build="build-gpu"
if [ $# -gt 0 ] && [[ "$1" != *.patch ]]; then build=$1; shift; fi
patches=("$@")
[ ${#patches[@]} -gt 0 ] || patches=(docs/unmeasured/*.patch)
[ -e "${patches[0]}" ] || { echo "ab_patches.sh: no patches given and none in docs/unmeasured" >&2; exit 2; }
out=${OUT:-out/ab_patches}
dir=$(realpath -m "${AB_PATCHES_DIR:-/tmp/ab_patches}")
tests=${AB_PATCHES_TESTS:-quick}
[[ "$tests" =~ ^(full|quick|none)$ ]] || { echo "ab_patches.sh: AB_PATCHES_TESTS is full, quick or none" >&2; exit 2; }
stage=${AB_PATCHES_STAGE:-all}
[[ "$stage" =~ ^(all|copies|tests|ab)$ ]] ||
  { echo "ab_patches.sh: AB_PATCHES_STAGE is all, copies, tests or ab" >&2; exit 2; }
mkdir -p "$out"
out_abs=$(realpath "$out")

names=()
declare -A file
for p in "${patches[@]}"; do
  [ -s "$p" ] || { echo "ab_patches.sh: $p is missing or empty" >&2; exit 2; }
  name=$(basename "$p" .patch)
  name=${name//[^A-Za-z0-9_]/_}
  [ -z "${file[$name]:-}" ] || { echo "ab_patches.sh: two patches are named $name" >&2; exit 2; }
  file[$name]=$(realpath "$p")
  names+=("$name")
done

# Per patch NAME, $dir/NAME.verdict says how far it got and $dir/NAME.passed marks one ready to measure:
# the `ab` stage of a later call reads them.
say() {  # name, verdict[, passed]
  echo "$2" >"$dir/$1.verdict"
  if [ -n "${3:-}" ]; then touch "$dir/$1.passed"; else status=1; fi
}
status=0
# A copy: this tree less build folders and outputs, the patch applied (checked first, so a patch that does
# not apply makes no copy and says where); NAME.applied records which patch made it.
make_copy() {  # name
  rm -rf "${dir:?}/$1" "$dir/$1".*
  mkdir -p "$out/$1" "$dir/$1"
  copy_tree "$dir/$1" "./${dir#"$PWD"/}" || exit 1
  if scripts/apply_patch.sh "$dir/$1" "${file[$1]}" >"$out/$1/patch.log" 2>&1; then
    sha256sum <"${file[$1]}" | cut -d' ' -f1 >"$dir/$1.applied"
  else
    rm -rf "${dir:?}/$1"
    say "$1" "does not apply to this tree ($out/$1/patch.log)"
  fi
}
if [ "$stage" != ab ]; then
  mkdir -p "$dir" || exit 1
  ok=()
  for name in "${names[@]}"; do
    if [ "$stage" = copies ] ||
       [ "$(cat "$dir/$name.applied" 2>/dev/null)" != "$(sha256sum <"${file[$name]}" | cut -d' ' -f1)" ]; then
      make_copy "$name"
    else
      rm -f "$dir/$name.verdict" "$dir/$name.passed" "$dir/$name.tests"  # a carried copy: built, tested below
      mkdir -p "$out/$name"
    fi
    [ -e "$dir/$name.applied" ] && ok+=("$name")
  done
  echo "== copies in $dir: ${ok[*]:-none}"
  if [ "$stage" = copies ]; then
    for name in "${ok[@]}"; do echo "applies" >"$dir/$name.verdict"; done  # not built: nothing to measure
    for name in "${names[@]}"; do echo "$name: $(cat "$dir/$name.verdict")"; done
    exit $status
  fi

  # Every build at once, the jobs shared: this tree's (ab.sh's, later a no-op) and each copy's.
  jobs=$(( $(nproc) / (${#ok[@]} + 1) > 1 ? $(nproc) / (${#ok[@]} + 1) : 1 ))
  build_tree() {  # source dir, build dir, log, targets...
    configure_build "$1" "$2" >"$3" 2>&1 &&
      cmake --build "$2" -j "$jobs" --target "${@:4}" >>"$3" 2>&1
  }
  targets=(tfe-bench tfe-plan)
  [ "$tests" = none ] || targets+=(tfe_gpu_tests)
  mkdir -p "$out/base"
  build_tree . "$build" "$out/base/build.log" tfe-bench tfe-plan &
  base_pid=$!
  declare -A pid
  for name in "${ok[@]}"; do
    build_tree "$dir/$name" "$dir/$name/$build" "$out/$name/build.log" "${targets[@]}" &
    pid[$name]=$!
  done
  wait "$base_pid" || { tail -30 "$out/base/build.log"; echo "ab_patches.sh: this tree did not build"; exit 1; }
  # A copy's tests start as soon as it is built, beside the other builds and tests: one GPU runs them all
  # at once (they check values, not times). Each leaves its exit status and verdict in NAME.tests.
  run_tests() {  # name
    local line rc
    case $tests in
      full)
        line=$(cd "$dir/$1" && OUT="$out_abs/$1/gpu_test" scripts/gpu_test.sh "$build" | tail -1)
        rc=$?
        line="tests (scripts/gpu_test.sh): $line";;
      quick)
        line=$(cd "$dir/$1" && OUT="$out_abs/$1/gpu_test" scripts/gpu_test_quick.sh "$build" | tail -1)
        rc=$?;;
      none)
        line="tests: none"
        rc=0;;
    esac
    echo "$rc $line" >"$dir/$1.tests"
  }
  declare -A test_pid
  for name in "${ok[@]}"; do
    if ! wait "${pid[$name]}"; then
      say "$name" "does not build ($out/$name/build.log)"
      continue
    fi
    run_tests "$name" &
    test_pid[$name]=$!
  done
  for name in "${ok[@]}"; do
    [ -n "${test_pid[$name]:-}" ] || continue
    wait "${test_pid[$name]}"
    read -r rc line <"$dir/$name.tests"
    if [ "$rc" -eq 0 ]; then say "$name" "$line" passed; else say "$name" "$line"; fi
  done
  if [ "$stage" = tests ]; then
    for name in "${names[@]}"; do echo "$name: $(cat "$dir/$name.verdict")"; done
    exit $status
  fi
fi

settings=(base='')
measured=()
for name in "${names[@]}"; do
  if [ -e "$dir/$name.passed" ]; then
    measured+=("$name")
    # A patch that adds an option (off by default) names its settings beside it, NAME.settings: a line
    # SETTING=tfe-bench options each, run as NAME_SETTING with the copy's build.
    listed="${file[$name]%.patch}.settings"
    if [ -f "$listed" ]; then
      while IFS= read -r line; do
        [[ -z "$line" || "$line" == \#* ]] && continue
        settings+=("${name}_${line%%=*}@$dir/$name/$build=${line#*=}")
      done <"$listed"
    else
      settings+=("$name@$dir/$name/$build=")
    fi
  else
    status=1
  fi
done
ab=0
if [ ${#measured[@]} -gt 0 ]; then
  AB_DRAFTS=report OUT="$out/ab" scripts/ab.sh "$build" "${settings[@]}" >"$out/ab.txt" 2>&1
  ab=$?
fi
for name in "${names[@]}"; do
  echo "$name: $(cat "$dir/$name.verdict" 2>/dev/null || echo "not built: run AB_PATCHES_STAGE=tests first")"
done
if [ ${#measured[@]} -gt 0 ]; then
  grep -v '^!!' "$out/ab.txt" | tail -40
else
  echo "ab_patches.sh: no patch to measure"
  status=1
fi
[ "$ab" -eq 0 ] && [ "$status" -eq 0 ]
