"""scripts/ab_change.sh end to end, without a GPU, in a stand-in tree (stand_in_tree.py: nothing is built,
the tests pass unless the tree holds a file FAIL, ab.sh records its arguments). The tree holds a change:
ab.sh gets the base (the change taken out, in a copy) against this tree, after the tests; the verdict is
printed, a failing test fails the run (ab.sh still runs), and the tree is left as it was. With
AB_CHANGE_DRY only the base is made; a patch the tree does not hold is refused with patch's reason. Exit 1 on a
difference, naming it.

Usage: python3 check_ab_change_flow.py SOURCE_DIR"""
import os
import sys
import tempfile

from stand_in_tree import check, diff, make, run_script

source = sys.argv[1]


with tempfile.TemporaryDirectory() as tmp:
    tree = os.path.join(tmp, "tree")
    make(source, tree)
    change = os.path.join(tmp, "change.patch")  # the tree holds it: notes.txt gained "two"
    open(change, "w").write(diff(tmp, "notes.txt", "one\n", "one\ntwo\n"))
    open(os.path.join(tree, "notes.txt"), "w").write("one\ntwo\n")
    base = os.path.join(tmp, "base")

    def run(out, patch=change, **extra):
        env = dict(AB_CHANGE_TESTS="quick", AB_CHANGE_BASE=base, OUT=os.path.join(tmp, out), **extra)
        return run_script(tree, "ab_change.sh", [patch, "build-gpu"], env)

    rc, said = run("out-dry", AB_CHANGE_DRY="1")
    check(rc == 0, f"a dry run failed (exit {rc}):\n{said}")
    check(open(os.path.join(base, "notes.txt")).read() == "one\n", "the dry run's base has the change in it")
    check(not os.path.exists(os.path.join(tmp, "out-dry", "ab")), "a dry run ran ab.sh")
    foreign = os.path.join(tmp, "foreign.patch")  # a change this tree does not hold
    open(foreign, "w").write(diff(tmp, "notes.txt", "zero\n", "nine\n"))
    rc, said = run("out-foreign", patch=foreign)
    check(rc == 1 and "does not reverse cleanly" in said, f"a foreign patch was taken (exit {rc}):\n{said}")
    check(not os.path.exists(os.path.join(tmp, "out-foreign", "ab")), "a foreign patch was measured")
    check(open(os.path.join(tree, "notes.txt")).read() == "one\ntwo\n", "a foreign patch changed the tree")

    rc, said = run("out")
    check(rc == 0, f"ab_change.sh failed on a change that passes (exit {rc}):\n{said}")
    check("tests (quick): all passed" in said, f"no tests verdict:\n{said}")
    args = open(os.path.join(tmp, "out", "ab", "args")).read().splitlines()
    want = ["build-gpu", f"base@{base}/build-gpu=", "change="]
    check(args == want, f"ab.sh was given {args}, not {want}")
    check(open(os.path.join(base, "notes.txt")).read() == "one\n", "the base does not have the change taken out")
    check(open(os.path.join(tree, "notes.txt")).read() == "one\ntwo\n", "ab_change.sh changed the tree")

    open(os.path.join(tree, "FAIL"), "w").write("")
    rc, said = run("out-failing")
    check(rc == 1, f"ab_change.sh passed with failing tests (exit {rc}):\n{said}")
    check("tests (quick): 1 failed" in said, f"the failing verdict is not printed:\n{said}")
    check(os.path.exists(os.path.join(tmp, "out-failing", "ab", "args")), "ab.sh did not run after failing tests")
print("ab_change.sh: a dry run, a foreign patch refused, the base against the change after the tests, "
      "a failing test failing the run")
