"""A stand-in tree for the device scripts' CPU tests: scripts/ab_patches.sh, scripts/ab_change.sh,
scripts/apply_patch.sh and scripts/build_lib.sh copied from the source, beside a CMake project that builds
nothing, a scripts/gpu_test_quick.sh that passes unless the tree holds a file FAIL, and a scripts/ab.sh that records
the arguments it is given (one a line, in $OUT/args)."""
import os
import shutil
import subprocess
import sys

FAKE_TESTS = """#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
if [ -e FAIL ]; then echo "tests (quick): 1 failed"; exit 1; fi
echo "tests (quick): all passed"
"""
FAKE_AB = """#!/usr/bin/env bash
mkdir -p "$OUT"
printf '%s\\n' "$@" >"$OUT/args"
echo "ab.sh stand-in: $# arguments"
"""


def make(source, tree):
    """The stand-in tree at `tree`, its one file notes.txt holding "one"."""
    os.makedirs(os.path.join(tree, "scripts"))
    for s in ("ab_patches.sh", "ab_change.sh", "apply_patch.sh", "build_lib.sh"):
        shutil.copy(os.path.join(source, "scripts", s), os.path.join(tree, "scripts", s))
    for s, text in (("gpu_test_quick.sh", FAKE_TESTS), ("ab.sh", FAKE_AB)):
        open(os.path.join(tree, "scripts", s), "w").write(text)
        os.chmod(os.path.join(tree, "scripts", s), 0o755)
    open(os.path.join(tree, "CMakeLists.txt"), "w").write(
        "cmake_minimum_required(VERSION 3.20)\nproject(stand_in NONE)\n"
        "foreach(t tfe-bench tfe-plan tfe_gpu_tests)\n  add_custom_target(${t})\nendforeach()\n")
    open(os.path.join(tree, "notes.txt"), "w").write("one\n")


def diff(tmp, name, before, after):
    """A unified diff of file `name` from `before` to `after` (None: absent), paths a/NAME and b/NAME."""
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    for d in (a, b):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    if before is not None:
        open(os.path.join(a, name), "w").write(before)
    if after is not None:
        open(os.path.join(b, name), "w").write(after)
    return subprocess.run(["diff", "-uN", f"a/{name}", f"b/{name}"], cwd=tmp, capture_output=True,
                          text=True).stdout


def run_script(tree, script, args, env):
    """Runs the tree's scripts/SCRIPT with `args`, the environment plus `env`: (exit status, stdout + stderr)."""
    r = subprocess.run(["bash", os.path.join(tree, "scripts", script), *args], env=dict(os.environ, **env),
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check(cond, what):
    """Exit 1 naming `what` unless `cond`."""
    if not cond:
        sys.exit(what)
