"""Adds up scripts/test.sh's stages: ctest's JUnit files and the stages that are one check each.

Prints each failed case, each skipped case with the reason its output gave, and last one line
"N passed, N failed, N skipped". Exits 1 when anything failed or nothing ran."""
import pathlib
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


def main(out_dir):
    out = pathlib.Path(out_dir)
    passed = failed = skipped = 0
    failures, skips = [], []
    for xml in sorted(out.glob("*.xml")):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{xml.stem}: {case.get('name')}"
            status = case.get("status", "")
            if case.find("failure") is not None or status == "fail":
                failed += 1
                failures.append(name)
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
    for s in skips:
        print(f"skipped: {s}")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
