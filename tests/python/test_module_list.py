"""The build copies the package's files by name (python/CMakeLists.txt, TFE_PY_FILES) into the build tree and
the wheel: a module missing there imports from the source tree yet is absent from both."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_build_lists_every_file_of_the_package():
    cmake = (ROOT / "python" / "CMakeLists.txt").read_text()
    listed = re.search(r"set\(TFE_PY_FILES([^)]*)\)", cmake)
    assert listed, "python/CMakeLists.txt sets no TFE_PY_FILES"
    listed = set(listed.group(1).split())
    present = {p.name for p in (ROOT / "python" / "tfe").iterdir() if p.is_file() and p.suffix in (".py", ".pyi", ".typed")}
    assert present - listed == set(), f"python/tfe files TFE_PY_FILES does not list: {sorted(present - listed)}"
    assert listed - present == set(), f"TFE_PY_FILES lists files python/tfe lacks: {sorted(listed - present)}"
