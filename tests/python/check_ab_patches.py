"""scripts/ab_patches.sh's copies, without a GPU (AB_PATCHES_STAGE=copies): each patch is applied to its own
copy of this tree, named after the patch file, with the patch's sha256 beside it; a patch that does not
apply makes no copy, is named in the verdict and fails the run, and never stops the others; this tree is
left as it was. Exit 1 on a difference, naming it.

Usage: python3 check_ab_patches.py SOURCE_DIR"""
import hashlib
import os
import subprocess
import sys
import tempfile

source = sys.argv[1]
script = os.path.join(source, "scripts", "ab_patches.sh")
readme = open(os.path.join(source, "README.md")).read()


def diff(before, after, tmp):
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    os.makedirs(a, exist_ok=True)
    os.makedirs(b, exist_ok=True)
    open(os.path.join(a, "README.md"), "w").write(before)
    open(os.path.join(b, "README.md"), "w").write(after)
    return subprocess.run(["diff", "-u", "a/README.md", "b/README.md"], cwd=tmp, capture_output=True,
                          text=True).stdout


with tempfile.TemporaryDirectory() as tmp:
    good = os.path.join(tmp, "adds-a-line.patch")  # applies: README.md gains a last line
    open(good, "w").write(diff(readme, readme + "one more line\n", tmp))
    bad = os.path.join(tmp, "foreign.patch")  # does not apply: it removes a line this README.md lacks
    open(bad, "w").write(diff(readme + "a line this tree lacks\n", readme, tmp))
    copies = os.path.join(tmp, "copies")
    env = dict(os.environ, AB_PATCHES_STAGE="copies", AB_PATCHES_DIR=copies, OUT=os.path.join(tmp, "out"))
    run = subprocess.run(["bash", script, good, bad], env=env, capture_output=True, text=True)
    said = run.stdout + run.stderr
    if run.returncode == 0:
        sys.exit(f"ab_patches.sh passed with a patch that does not apply: {said}")
    if "adds_a_line: applies" not in said or "foreign: does not apply" not in said:
        sys.exit(f"ab_patches.sh's verdicts do not name each patch and its fate: {said}")
    copy = os.path.join(copies, "adds_a_line", "README.md")
    if not os.path.exists(copy) or open(copy).read() != readme + "one more line\n":
        sys.exit("the copy of adds_a_line is not this tree with the patch applied")
    applied = open(os.path.join(copies, "adds_a_line.applied")).read().strip()
    if applied != hashlib.sha256(open(good, "rb").read()).hexdigest():
        sys.exit(f"adds_a_line.applied holds {applied!r}, not the patch's sha256")
    if os.path.exists(os.path.join(copies, "foreign")):
        sys.exit("a patch that does not apply left a copy")
    if any(name.startswith("build") for name in os.listdir(os.path.join(copies, "adds_a_line"))):
        sys.exit("the copy holds a build folder")
    if open(os.path.join(source, "README.md")).read() != readme:
        sys.exit("ab_patches.sh changed this tree's README.md")
    run = subprocess.run(["bash", script, good], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"ab_patches.sh refused a patch that applies (exit {run.returncode}): {run.stdout}{run.stderr}")
print("ab_patches.sh: a copy per patch with it applied, a foreign patch named and failed, this tree untouched")
