"""The `tfe-plan` command of the package: the CLI binary built with the module, inside the package."""

import os
import shutil
import sys


def tfe_plan_executable() -> str:
    """The path of tfe-plan: the package's own (tfe/bin/tfe-plan), else $TFE_PLAN, else the one on PATH."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tfe-plan")
    for candidate in (here, os.environ.get("TFE_PLAN", "")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("tfe-plan")
    if found:
        return found
    raise FileNotFoundError(f"tfe-plan: not at {here}, $TFE_PLAN is unset, and none is on PATH")


def main() -> None:
    exe = tfe_plan_executable()
    os.execv(exe, [exe, *sys.argv[1:]])
