# shellcheck shell=bash
# Shared by the scripts that build tfe on a GPU machine (sourced, from the repository root).

# The CMake configure every one of them runs: Ninja, RelWithDebInfo, and the headers that
# scripts/stage_deps.sh staged in the root's .deps/ (the GPU machine has no nlohmann-json or CLI11).
# Usage: configure_build SOURCE_DIR BUILD_DIR [more cmake arguments]
configure_build() {
  local prefix=()
  [ -d "$PWD/.deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps")
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${prefix[@]}" "${@:3}"
}

# A copy of this tree into DEST (made by the caller) less build folders, outputs, git and any EXCLUDE
# (tar patterns relative to the root, ./name): the trees that ab_change.sh and ab_patches.sh build beside it.
# Usage: copy_tree DEST [EXCLUDE ...]
copy_tree() {
  local dest=$1 excludes=(--exclude='./build*' --exclude=./out --exclude=./.git)
  shift
  local e
  for e in "$@"; do excludes+=(--exclude="$e"); done
  tar cf - "${excludes[@]}" . | tar xf - -C "$dest"
}
