#!/usr/bin/env bash
# Applies a unified diff (paths a/... b/..., as `git diff` writes them) to the tree in DIR, or takes it out
# with --reverse: checked whole first, so a patch that does not fit changes nothing and the reason is
# printed. With `patch` where it is installed, else with `git apply` (which works outside a repository too):
# a machine may have only one of them.
#
# Usage: scripts/apply_patch.sh DIR PATCH [--reverse]
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/apply_patch.sh DIR PATCH [--reverse]" >&2; exit 2; }
dir=$1
file=$(realpath "$2") || exit 2
reverse=${3:-}
[ -z "$reverse" ] || [ "$reverse" = --reverse ] ||
  { echo "apply_patch.sh: the third argument is --reverse" >&2; exit 2; }
cd "$dir" || exit 2
if command -v patch >/dev/null; then
  flags=(-p1 -s -f)  # -f: never ask (no terminal), never take a patch as reversed on its own
  [ -n "$reverse" ] && flags+=(-R)
  patch "${flags[@]}" --dry-run <"$file" && patch "${flags[@]}" <"$file"
elif command -v git >/dev/null; then
  flags=(-p1)
  [ -n "$reverse" ] && flags+=(-R)
  git apply "${flags[@]}" --check "$file" && git apply "${flags[@]}" "$file"
else
  echo "apply_patch.sh: neither patch nor git is installed here; make the trees on a machine with one" >&2
  exit 2
fi
