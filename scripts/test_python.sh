#!/usr/bin/env bash
# Builds the Python package with `pip install .` into a virtual environment and runs its tests
# (tests/python/test_package.py). The environment sees the system's packages (torch, numpy, nanobind,
# scikit-build-core, pytest where installed), and the build uses them in place (--no-build-isolation), so
# that a machine without a network builds too; what is missing is installed from PyPI when it can be.
# The CMake build is kept in build-py/ between runs. Usage: scripts/test_python.sh [VENV_DIR] (default .venv-py)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-py}
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
py="$venv/bin/python"
"$py" -c 'import nanobind, scikit_build_core, pytest, numpy' 2>/dev/null ||
  "$py" -m pip install -q nanobind scikit-build-core pytest numpy
# Optional: the tests that compare with files the safetensors package reads skip without it.
"$py" -c 'import safetensors' 2>/dev/null || "$py" -m pip install -q safetensors || true
# scripts/stage_deps.sh's headers, where this machine lacks them (the GPU machine).
[ -d .deps ] && export CMAKE_PREFIX_PATH="$PWD/.deps${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$PWD"
fi
"$py" -m pip install -q --no-build-isolation --no-deps -C build-dir=build-py .
# From the repository root, `import tfe` finds the installed package (the source is under python/).
exec "$py" -m pytest -q -p no:cacheprovider tests/python
