"""scripts/ab_patches.sh end to end, without a GPU, in a stand-in tree (stand_in_tree.py: nothing is built,
the tests pass unless a copy holds a file FAIL, ab.sh records the settings it is given). Four patches: one
that passes, one whose tests fail, one that does not apply, and one with a NAME.settings file. Checked:
each patch's verdict, that only the copies that passed are measured, with the settings file's lines as
settings, the exit status, and that the `tests` then `ab` stages give the same as one run, reusing the
copies that a `copies` run made (the patch's sha256 beside each, no build folder in it). Exit 1 on a
difference, naming it.

Usage: python3 check_ab_patches_flow.py SOURCE_DIR"""
import hashlib
import os
import sys
import tempfile

from stand_in_tree import check, diff, make, run_script

source = sys.argv[1]


with tempfile.TemporaryDirectory() as tmp:
    tree = os.path.join(tmp, "tree")
    make(source, tree)

    patches = os.path.join(tmp, "patches")
    os.makedirs(patches)
    open(os.path.join(patches, "passes.patch"), "w").write(diff(tmp, "notes.txt", "one\n", "one\ntwo\n"))
    open(os.path.join(patches, "fails.patch"), "w").write(diff(tmp, "FAIL", None, "x\n"))
    open(os.path.join(patches, "foreign.patch"), "w").write(diff(tmp, "notes.txt", "zero\n", "one\n"))
    open(os.path.join(patches, "option.patch"), "w").write(diff(tmp, "option.txt", None, "on\n"))
    open(os.path.join(patches, "option.settings"), "w").write("# two settings\nlow=--knob 1\n\nhigh=--knob 2\n")
    names = ["passes", "fails", "foreign", "option"]
    files = [os.path.join(patches, n + ".patch") for n in names]

    def run(stage, out):
        env = dict(AB_PATCHES_STAGE=stage, AB_PATCHES_DIR=os.path.join(tree, ".copies"), OUT=os.path.join(tmp, out))
        return run_script(tree, "ab_patches.sh", ["build-gpu", *files], env)

    def verdicts(said):
        return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in said.splitlines()
                if line.split(":", 1)[0] in names}

    def expect_measured(out, said, how):
        args = open(os.path.join(tmp, out, "ab", "args")).read().splitlines()
        check(args[0] == "build-gpu" and args[1] == "base=", f"{how}: ab.sh's first arguments are {args[:2]}")
        copies = os.path.join(tree, ".copies")
        want = [f"passes@{copies}/passes/build-gpu=", f"option_low@{copies}/option/build-gpu=--knob 1",
                f"option_high@{copies}/option/build-gpu=--knob 2"]
        check(args[2:] == want, f"{how}: ab.sh was given {args[2:]}, not {want}")
        v = verdicts(said)
        check(v.get("passes") == "tests (quick): all passed", f"{how}: passes: {v.get('passes')}")
        check(v.get("fails") == "tests (quick): 1 failed", f"{how}: fails: {v.get('fails')}")
        check(v.get("foreign", "").startswith("does not apply"), f"{how}: foreign: {v.get('foreign')}")
        check(v.get("option") == "tests (quick): all passed", f"{how}: option: {v.get('option')}")

    rc, said = run("all", "out-all")
    check(rc == 1, f"one run: exit {rc} with a failing and a foreign patch:\n{said}")
    expect_measured("out-all", said, "one run")

    # The staged form, with copies made first (as on a machine without patch or git, carried there).
    rc, said = run("copies", "out-copies")
    check(rc == 1 and verdicts(said).get("passes") == "applies", f"copies stage: exit {rc}:\n{said}")
    applied = open(os.path.join(tree, ".copies", "passes.applied")).read().strip()
    check(applied == hashlib.sha256(open(files[0], "rb").read()).hexdigest(),
          f"passes.applied holds {applied!r}, not the patch's sha256")
    check(not os.path.exists(os.path.join(tree, ".copies", "foreign")), "a patch that does not apply left a copy")
    # The one run built this tree in build-gpu; a copy made after it holds no build folder, nor the copies.
    check(os.path.isdir(os.path.join(tree, "build-gpu")), "the one run did not build this tree in build-gpu")
    check(not os.path.exists(os.path.join(tree, ".copies", "passes", "build-gpu")), "a copy holds a build folder")
    check(not os.path.exists(os.path.join(tree, ".copies", "passes", ".copies")), "a copy holds the copies")
    marker = os.path.join(tree, ".copies", "passes", "reused")
    open(marker, "w").write("")  # a copy the tests stage must keep, not remake
    rc, said = run("tests", "out-staged")
    check(rc == 1, f"tests stage: exit {rc}:\n{said}")
    check(os.path.exists(marker), "the tests stage remade a copy that a copies stage made from the same patch")
    check(not os.path.exists(os.path.join(tmp, "out-staged", "ab")), "the tests stage ran ab.sh")
    rc, said = run("ab", "out-staged")
    check(rc == 1, f"ab stage: exit {rc}:\n{said}")
    expect_measured("out-staged", said, "staged")
    check(open(os.path.join(tree, "notes.txt")).read() == "one\n", "ab_patches.sh changed the tree it ran in")
print("ab_patches.sh: verdicts, settings and exit status as expected, in one run and in stages")
