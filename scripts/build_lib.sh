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
