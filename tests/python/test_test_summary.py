"""scripts/test_summary.py, the last lines of scripts/test.sh: every skip with the test's own reason, every
failure, and the count line. Needs neither the module nor a GPU."""

import pathlib
import subprocess
import sys

SUMMARY = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "test_summary.py"

# As ctest 3.25 writes it (--output-junit): a skip's message is the rule that matched, the reason is in
# the output.
CTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="6" failures="1" disabled="0" skipped="4" hostname="" time="0">
  <testcase name="tfe_gpu_tests" classname="tfe_gpu_tests" time="0.1" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>[doctest] run with "--help" for options
skipped: no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected)
</system-out>
  </testcase>
  <testcase name="broadcast: 2 ranks, direct" classname="broadcast: 2 ranks, direct" time="0.1" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>skipped: 2 ranks need 2 GPUs, 0 found
</system-out>
  </testcase>
  <testcase name="scripts: shellcheck finds nothing" classname="x" time="0.1" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>shellcheck is not installed
</system-out>
  </testcase>
  <testcase name="silent" classname="silent" time="0.1" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/>
    <system-out></system-out>
  </testcase>
  <testcase name="head: reads" classname="head: reads" time="0.1" status="run">
    <system-out></system-out>
  </testcase>
  <testcase name="plan: refuses (*)" classname="plan: refuses (*)" time="0.1" status="fail">
    <failure message=""/>
    <system-out>CHECK failed</system-out>
  </testcase>
</testsuite>
"""

# As pytest writes it (--junitxml): the reason is the skip's message.
PYTEST_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="1" tests="2">
  <testcase classname="tests.target.test_target" name="test_greedy_exact" time="0.001">
    <skipped type="pytest.skip" message="torch is not importable">tests/target/test_target.py:12: torch is not importable</skipped>
  </testcase>
  <testcase classname="tests.target.test_target" name="test_loads" time="0.001"/>
</testsuite></testsuites>
"""


NEXT = [
    "  one stage again   scripts/test.sh STAGE  (build format package sanitize fuzz target)",
    "  the GPU suite     scripts/gpu_test.sh  (on a GPU machine)",
    "  the main job      scripts/run.sh",
]


def summary(out):
    """(exit status, the lines before "next:", the lines of what to run next, the count line)"""
    run = subprocess.run([sys.executable, str(SUMMARY), str(out)], capture_output=True, text=True)
    lines = run.stdout.splitlines()
    assert "next:" in lines, run.stdout + run.stderr
    at = lines.index("next:")
    return run.returncode, lines[:at], lines[at + 1 : -1], lines[-1]


def test_skips_carry_the_tests_own_reason(tmp_path):
    (tmp_path / "build.xml").write_text(CTEST_XML)
    (tmp_path / "target.xml").write_text(PYTEST_XML)
    (tmp_path / "stage_passes.txt").write_text("format\npackage\n")
    (tmp_path / "stage_skips.txt").write_text("fuzz\tclang is not installed\n")
    (tmp_path / "stage_times.txt").write_text("setup\t6\nbuild\t660\nformat\t3\n")
    rc, lines, nexts, count = summary(tmp_path)
    assert lines == [
        "skipped: build: tfe_gpu_tests (no CUDA device (cudaGetDeviceCount: no CUDA-capable device is detected))",
        "skipped: build: broadcast: 2 ranks, direct (2 ranks need 2 GPUs, 0 found)",
        "skipped: build: scripts: shellcheck finds nothing (shellcheck is not installed)",
        "skipped: build: silent (no reason printed; SKIP_RETURN_CODE=77)",
        "skipped: target: test_greedy_exact (torch is not importable)",
        "skipped: fuzz (clang is not installed)",
        "FAILED: build: plan: refuses (*)",
        "time: setup 0.1, build 11.0, format 0.1; total 11.2 min",
    ]
    assert count == "4 passed, 1 failed, 6 skipped"
    assert nexts == ["  the first failure ctest --test-dir build -R '^plan: refuses \\(\\*\\)$' --output-on-failure"] + NEXT
    assert rc == 1


def test_exit_status(tmp_path):
    (tmp_path / "target.xml").write_text(PYTEST_XML)
    assert summary(tmp_path) == (0, ["skipped: target: test_greedy_exact (torch is not importable)"], NEXT,
                                 "1 passed, 0 failed, 1 skipped")
    (tmp_path / "stage_failures.txt").write_text("sanitize\tthe sanitizer build failed\n")
    rc, lines, nexts, count = summary(tmp_path)
    assert rc == 1 and lines[-1] == "FAILED: sanitize: the sanitizer build failed"
    assert nexts[0] == "  the first failure scripts/test.sh sanitize"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert summary(empty) == (1, [], NEXT, "0 passed, 0 failed, 0 skipped")  # nothing ran is a failure
