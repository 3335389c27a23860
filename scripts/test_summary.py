"""Adds up scripts/test.sh's stages: ctest's JUnit files and the stages that are one check each.

Prints each failed case, each skipped case with the reason its output gave, each stage's time, what to run
next, and last one line "N passed, N failed, N skipped". Exits 1 when anything failed or nothing ran."""
import pathlib
import re
import shlex
import sys
import xml.etree.ElementTree as ET


def skip_reason(case):
    # pytest's JUnit file carries the reason as the message of <skipped>; ctest's carries only the rule
    # that matched ("SKIP_RETURN_CODE=77"), and the test's own reason is in its output.
    skipped = case.find("skipped")
    message = skipped.get("message", "") if skipped is not None else ""
    if message and not message.startswith(("SKIP_RETURN_CODE=", "SKIP_REGULAR_EXPRESSION_MATCHED")):
        return message.removeprefix("Skipped: ")
    out = case.find("system-out")
    text = (out.text or "") if out is not None else ""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    # tests/main.cpp and the GPU tests print a line "skipped: ..." before exiting 77; other tests print
    # their reason last.
    reasons = [l for l in lines if l.startswith("skipped")]
    if not reasons:
        return lines[-1] if lines else f"no reason printed; {message or 'skipped'}"
    reason = reasons[-1].removeprefix("skipped").lstrip(": ")
    return reason.removeprefix(case.get("name", "") + ": ")


# The build directory of each ctest stage, to rerun one of its cases.
CTEST_DIRS = {"build": "build", "sanitize": "build-asan"}


def rerun(stage, case):
    """The command that runs one failed case again, alone and with its output (a stage that is one check:
    the stage)."""
    if case and stage in CTEST_DIRS:
        # ctest's -R is a CMake regular expression: its special characters stand for themselves escaped.
        pattern = shlex.quote("^" + re.sub(r"([][\\^$.|()*+?])", r"\\\1", case) + "$")
        return f"ctest --test-dir {CTEST_DIRS[stage]} -R {pattern} --output-on-failure"
    if case and stage == "target":
        return (f"PYTHONPATH=build/python build-target/venv/bin/python -m pytest tests/target "
                f"-k {shlex.quote(case)}")
    return f"scripts/test.sh {stage}"


def main(out_dir):
    out = pathlib.Path(out_dir)
    passed = failed = skipped = 0
    failures, skips, reruns = [], [], []
    for xml in sorted(out.glob("*.xml")):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{xml.stem}: {case.get('name')}"
            status = case.get("status", "")
            if case.find("failure") is not None or case.find("error") is not None or status == "fail":
                failed += 1
                failures.append(name)
                reruns.append(rerun(xml.stem, case.get("name")))
            elif case.find("skipped") is not None or status in ("notrun", "disabled"):
                skipped += 1
                skips.append(f"{name} ({skip_reason(case)})")
            else:
                passed += 1
    passes = out / "stage_passes.txt"
    if passes.exists():
        passed += len(passes.read_text().split())
    stage_skips = out / "stage_skips.txt"
    if stage_skips.exists():
        for line in stage_skips.read_text().splitlines():
            skipped += 1
            skips.append(line.replace("\t", " (", 1) + ")")
    stage_failures = out / "stage_failures.txt"
    if stage_failures.exists():
        for line in stage_failures.read_text().splitlines():
            failed += 1
            failures.append(line.replace("\t", ": "))
            reruns.append(rerun(line.split("\t")[0], ""))
    for s in skips:
        print(f"skipped: {s}")
    for f in failures:
        print(f"FAILED: {f}")
    times = out / "stage_times.txt"
    if times.exists():
        spent = [(name, int(sec)) for name, sec in (l.split("\t") for l in times.read_text().splitlines())]
        total = sum(sec for _, sec in spent)
        print("time: " + ", ".join(f"{name} {sec / 60:.1f}" for name, sec in spent) + f"; total {total / 60:.1f} min")
    print("next:")
    nexts = []
    if reruns:
        nexts.append(("the first failure", reruns[0]))
    nexts += [
        ("one stage again", "scripts/test.sh STAGE  (build format package sanitize fuzz target)"),
        ("the GPU suite", "scripts/gpu_test.sh  (on a GPU machine)"),
        ("the main job", "scripts/run.sh"),
    ]
    for what, command in nexts:
        print(f"  {what:<17} {command}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
