#!/usr/bin/env bash
# Copies the two header-only libraries that a build machine may lack (nlohmann-json, CLI11) into .deps/,
# headers and CMake package files both, so that a machine without them configures with
#   cmake -DCMAKE_PREFIX_PATH=$PWD/.deps ...
# (scripts/gpu_test.sh does this when .deps/ exists). The package files locate their headers relative to
# themselves, so the copies work from any checkout path. .deps/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.deps
for lib in nlohmann CLI; do
  [ -d "/usr/include/$lib" ] || { echo "stage_deps: /usr/include/$lib not found (install nlohmann-json3-dev / libcli11-dev)" >&2; exit 1; }
done
rm -rf "$dest"
mkdir -p "$dest/include" "$dest/share/cmake"
cp -r /usr/include/nlohmann /usr/include/CLI "$dest/include/"
for pkg in nlohmann_json CLI11; do
  found=
  for dir in /usr/share/cmake /usr/lib/cmake /usr/lib/x86_64-linux-gnu/cmake /usr/local/share/cmake; do
    if [ -d "$dir/$pkg" ]; then cp -r "$dir/$pkg" "$dest/share/cmake/"; found=1; break; fi
  done
  [ -n "$found" ] || { echo "stage_deps: no CMake package files for $pkg" >&2; exit 1; }
done
echo "stage_deps: $(du -sh "$dest" | cut -f1) in $dest (configure with -DCMAKE_PREFIX_PATH=$PWD/$dest)"
