"""Plain eager PyTorch decode of a Qwen3 checkpoint: the baseline `slm-train bench engine` measures beside
its own decode rows in the same run (issue 19, item 4).

What it runs is what Hugging Face `transformers` (modeling_qwen3.py, eager attention, DynamicCache,
GenerationMixin._sample) does, written out with plain torch operations, since Debian's python3-torch
(1.13) comes without transformers or safetensors:
  embedding; per layer: RMSNorm -> q/k/v projections -> per-head q_norm / k_norm (RMSNorm) -> RoPE
  (rope_theta from config.json) -> KV cache grown by torch.cat each step (as DynamicCache.update) ->
  repeat_kv for grouped-query attention -> softmax(Q K^T / sqrt(d) + mask, in float32) V -> o_proj;
  post-attention RMSNorm -> down(silu(gate) * up); final norm; lm_head (the embedding when
  tie_word_embeddings) over the last position only; sampling: logits in float32, softmax at
  temperature 1, torch.multinomial (or argmax with --greedy); input_ids grown by torch.cat.

Usage:
  /usr/bin/python3 bench/eager_decode.py --model DIR [--batch 16] [--steps 32] [--threads N]
      [--dtype float32|bfloat16] [--prompt-len 32] [--prompts JSON] [--greedy] [--seed 0]
Prompts: row b, position i holds ((b * 131 + i) * 7919) % 100000 + 100 (the ids `bench engine` uses),
unless --prompts gives a JSON list of equal-length lists of token ids.
Prints one JSON line:
  {"torch", "threads", "batch", "steps", "dtype", "prompt_len", "prefill_ms", "step_ms",
   "tokens_per_s", "tokens": [[...]] (with --greedy or --print-tokens),
   "margins": [[...]] (with --greedy: per row and new token, the top-1 minus the top-2 logit)}
step_ms is the median over the decode steps of one step (forward + sampling); the prefill computes the
first new token, then --steps decode steps compute one token per row each.
"""
import argparse
import json
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def fail(msg):
    sys.stderr.write("eager_decode: %s\n" % msg)
    sys.exit(2)


def read_safetensors(path):
    """8-byte little-endian header length, the JSON header, then the raw tensor data."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    if len(raw) < 8:
        fail("%s: expected a safetensors file, found %d bytes" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(bytes(raw[8 : 8 + n]))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = ST_DTYPES.get(e["dtype"])
        if dt is None:
            fail("%s: tensor %s has dtype %s; expected one of %s" % (path, name, e["dtype"], ", ".join(ST_DTYPES)))
        a, b = e["data_offsets"]
        size = torch.tensor([], dtype=dt).element_size()
        count = (b - a) // size
        t = torch.frombuffer(raw, dtype=dt, count=count, offset=base + a) if count else torch.zeros(0, dtype=dt)
        # A copy in its own (aligned) allocation, as the parameters of a Hugging Face model are.
        out[name] = t.reshape(e["shape"]).clone()
    return out


def read_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        w.update(read_safetensors(os.path.join(model_dir, name)))
    return w


class RMSNorm(torch.nn.Module):
    """Qwen3RMSNorm: in float32, then the weight times the result cast back to the input dtype."""

    def __init__(self, weight, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)


class Linear(torch.nn.Module):
    """torch.nn.Linear's forward (F.linear) over given weights, without its random initialisation."""

    def __init__(self, w, b=None):
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.bias = None if b is None else torch.nn.Parameter(b, requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


linear = Linear


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def repeat_kv(x, n_rep):
    if n_rep == 1:
        return x
    b, nkv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, d).reshape(b, nkv * n_rep, t, d)


class Attention(torch.nn.Module):
    def __init__(self, w, p, cfg, dtype):
        super().__init__()
        self.nq = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads") or self.nq
        self.D = cfg.get("head_dim") or cfg["hidden_size"] // self.nq
        self.scaling = self.D**-0.5
        bias = bool(cfg.get("attention_bias", False))
        g = lambda n: w[p + n].to(dtype)
        gb = lambda n: g(n) if bias else None
        self.q_proj = linear(g("q_proj.weight"), gb("q_proj.bias"))
        self.k_proj = linear(g("k_proj.weight"), gb("k_proj.bias"))
        self.v_proj = linear(g("v_proj.weight"), gb("v_proj.bias"))
        self.o_proj = linear(g("o_proj.weight"), gb("o_proj.bias"))
        self.q_norm = RMSNorm(g("q_norm.weight"), cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(g("k_norm.weight"), cfg["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, cache):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.D)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.D)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.D).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # DynamicCache.update: the cache grows by concatenation every step.
        if cache[0] is None:
            cache[0], cache[1] = k, v
        else:
            cache[0] = torch.cat([cache[0], k], dim=-2)
            cache[1] = torch.cat([cache[1], v], dim=-2)
        k = repeat_kv(cache[0], self.nq // self.nkv)
        v = repeat_kv(cache[1], self.nq // self.nkv)
        a = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        a = a + mask[:, :, :, : k.shape[-2]]
        a = F.softmax(a, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(a, v).transpose(1, 2).contiguous().reshape(B, T, -1)
        return self.o_proj(o)


class Layer(torch.nn.Module):
    def __init__(self, w, i, cfg, dtype):
        super().__init__()
        p = "model.layers.%d." % i
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"].to(dtype), eps)
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"].to(dtype), eps)
        self.self_attn = Attention(w, p + "self_attn.", cfg, dtype)
        g = lambda n: w[p + "mlp." + n + ".weight"].to(dtype)
        self.gate_proj = linear(g("gate_proj"))
        self.up_proj = linear(g("up_proj"))
        self.down_proj = linear(g("down_proj"))

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Qwen3(torch.nn.Module):
    def __init__(self, model_dir, dtype):
        super().__init__()
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "qwen3":
            fail("%s: expected model_type qwen3 in config.json, found %r" % (model_dir, cfg.get("model_type")))
        if cfg.get("rope_scaling"):
            fail("%s: rope_scaling %r is not implemented here (default RoPE only)" % (model_dir, cfg["rope_scaling"]))
        w = read_weights(model_dir)
        self.cfg = cfg
        self.dtype = dtype
        self.embed = torch.nn.Embedding.from_pretrained(w["model.embed_tokens.weight"].to(dtype), freeze=True)
        self.layers = torch.nn.ModuleList(Layer(w, i, cfg, dtype) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(w["model.norm.weight"].to(dtype), cfg["rms_norm_eps"])
        head = self.embed.weight if cfg.get("tie_word_embeddings") else w["lm_head.weight"].to(dtype)
        self.lm_head = linear(head)
        D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        base = float(cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))

    def rope(self, pos):
        """Qwen3RotaryEmbedding: cos/sin computed in float32, cast to the model's dtype."""
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def forward(self, ids, pos, mask, caches):
        x = self.embed(ids)
        cos, sin = self.rope(pos)
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cos, sin, mask, cache)
        x = self.norm(x[:, -1:, :])  # logits_to_keep=1: only the last position goes through the head
        return self.lm_head(x)[:, -1, :]


def causal_mask(B, T, past, dtype):
    """The 4-D additive mask HF's eager attention gets: [B, 1, T, past + T], min where masked."""
    m = torch.full((T, past + T), torch.finfo(dtype).min, dtype=dtype)
    m = torch.triu(m, diagonal=past + 1)
    return m[None, None].expand(B, 1, T, past + T)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--print-tokens", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if a.dtype not in dtypes:
        fail("--dtype: expected float32 or bfloat16, found %r" % a.dtype)
    if a.steps < 1 or a.batch < 1 or a.prompt_len < 1 or a.threads < 0:
        fail(
            "--steps, --batch and --prompt-len must be >= 1 and --threads >= 0; found steps %d, batch %d, prompt-len %d, threads %d"
            % (a.steps, a.batch, a.prompt_len, a.threads)
        )
    if not os.path.exists(os.path.join(a.model, "config.json")):
        fail("--model: expected a directory with config.json and model.safetensors, found %r" % a.model)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dtype = dtypes[a.dtype]
    if a.prompts is not None:
        prompts = json.loads(a.prompts)
        if not prompts or len(set(len(p) for p in prompts)) != 1:
            fail("--prompts: expected a JSON list of equal-length lists of token ids, found %s" % a.prompts[:200])
    else:
        prompts = [[((b * 131 + i) * 7919) % 100000 + 100 for i in range(a.prompt_len)] for b in range(a.batch)]
    with torch.no_grad():
        model = Qwen3(a.model, dtype).eval()
        V = model.cfg["vocab_size"]
        input_ids = torch.tensor(prompts, dtype=torch.long)
        if int(input_ids.max()) >= V or int(input_ids.min()) < 0:
            fail("--prompts: token ids must lie in [0, %d)" % V)
        B, T = input_ids.shape

        margins = []  # greedy: top-1 minus top-2 logit per step and row (near ties make tokens fragile)

        def pick(logits):
            logits = logits.to(copy=True, dtype=torch.float32)
            if a.greedy:
                top = torch.topk(logits, 2, dim=-1).values
                margins.append((top[:, 0] - top[:, 1]).tolist())
                return torch.argmax(logits, dim=-1)
            probs = F.softmax(logits, dim=-1)  # temperature 1: no warper
            return torch.multinomial(probs, num_samples=1).squeeze(1)

        def run(steps, timed):
            caches = [[None, None] for _ in model.layers]
            ids = input_ids
            t0 = time.perf_counter()
            pos = torch.arange(T)[None].expand(B, T)
            nxt = pick(model(ids, pos, causal_mask(B, T, 0, dtype), caches))
            ids = torch.cat([ids, nxt[:, None]], dim=-1)
            prefill = time.perf_counter() - t0
            times = []
            for s in range(steps):
                t0 = time.perf_counter()
                past = ids.shape[1] - 1
                pos = torch.full((B, 1), past, dtype=torch.long)
                nxt = pick(model(ids[:, -1:], pos, causal_mask(B, 1, past, dtype), caches))
                ids = torch.cat([ids, nxt[:, None]], dim=-1)
                times.append(time.perf_counter() - t0)
            return ids[:, T:], prefill, times

        run(1, False)  # warm-up (allocator, thread pool)
        margins.clear()
        tokens, prefill, times = run(a.steps, True)
    step = sorted(times)[len(times) // 2]
    out = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": B,
        "steps": a.steps,
        "dtype": a.dtype,
        "prompt_len": T,
        "greedy": a.greedy,
        "prefill_ms": round(prefill * 1e3, 3),
        "step_ms": round(step * 1e3, 3),
        "tokens_per_s": round(B / step, 1),
    }
    if a.greedy or a.print_tokens:
        out["tokens"] = tokens.tolist()
    if a.greedy:
        out["margins"] = [[round(m[b], 6) for m in margins] for b in range(B)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
