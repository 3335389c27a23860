"""scripts/ab_change.sh's base tree, without a GPU (AB_CHANGE_DRY=1): for a patch this tree holds (here, one
that adds README.md's last line), the base is this tree with the patch reversed and this tree is left as
it was; a patch that does not match this tree is refused with patch's reason, and no base is made from it.
Exit 1 on a difference, naming it.

Usage: python3 check_ab_change_base.py SOURCE_DIR"""
import os
import subprocess
import sys
import tempfile

source = sys.argv[1]
script = os.path.join(source, "scripts", "ab_change.sh")
readme = open(os.path.join(source, "README.md")).read()
before = readme[: readme.rstrip("\n").rfind("\n") + 1]  # README.md less its last line
with tempfile.TemporaryDirectory() as tmp:
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    os.makedirs(a)
    os.makedirs(b)
    open(os.path.join(a, "README.md"), "w").write(before)
    open(os.path.join(b, "README.md"), "w").write(readme)
    diff = subprocess.run(["diff", "-u", "a/README.md", "b/README.md"], cwd=tmp, capture_output=True, text=True)
    patch = os.path.join(tmp, "change.patch")
    open(patch, "w").write(diff.stdout)
    base = os.path.join(tmp, "base")
    env = dict(os.environ, AB_CHANGE_DRY="1", AB_CHANGE_BASE=base, OUT=os.path.join(tmp, "out"))
    run = subprocess.run(["bash", script, patch], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"ab_change.sh refused a patch this tree holds (exit {run.returncode}): {run.stdout}{run.stderr}")
    if open(os.path.join(base, "README.md")).read() != before:
        sys.exit("the base's README.md is not this tree's with the patch reversed")
    if open(os.path.join(source, "README.md")).read() != readme:
        sys.exit("ab_change.sh changed this tree's README.md")
    if os.path.exists(os.path.join(base, "build")):
        sys.exit("the base holds a build folder")

    reversed_patch = os.path.join(tmp, "reversed.patch")  # the change this tree does not hold
    open(reversed_patch, "w").write(
        subprocess.run(["diff", "-u", "b/README.md", "a/README.md"], cwd=tmp, capture_output=True, text=True).stdout)
    env["AB_CHANGE_BASE"] = os.path.join(tmp, "base2")
    run = subprocess.run(["bash", script, reversed_patch], env=env, capture_output=True, text=True)
    if run.returncode == 0 or "does not reverse cleanly" not in run.stdout:
        sys.exit(f"ab_change.sh took a patch this tree does not hold (exit {run.returncode}): {run.stdout}")
print("ab_change.sh's base: the patch reversed, this tree untouched, a foreign patch refused")
