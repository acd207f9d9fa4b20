"""Independent float64 reference for the native engine's decoder: Qwen3, Qwen2/2.5 and Llama 3.x.

Written from the Hugging Face formulas (modeling_qwen3.py, modeling_qwen2.py, modeling_llama.py and
modeling_rope_utils.py), sharing no code with the engine: it reads config.json and model.safetensors
itself (no `safetensors` package needed), optionally a PEFT LoRA adapter, and computes everything in
float64 with plain torch operations and no KV cache.

Request (JSON on stdin):
  {"model_dir": DIR, "adapter_dir": DIR | null,
   "cases": [{"input_ids": [[..]], "attention_mask": [[..]], "position_ids": [[..]]}],
   "greedy": [{"prompt": [..], "steps": N}, ...] | null,
   "sft_grad": {"ids": [..], "mask": [..]} | null}
Reply (JSON on stdout):
  {"cases": [{"logits": [B][T][V] with null at padded positions}],
   "greedy": [{"tokens": [..], "margins": [..]}, ...],  # margins: top-1 minus top-2 logit at each step
   "sft_grad": {"loss": x, "grads": {peft tensor name: flat list}}}
   (sft_grad: mean over trained tokens t of -log p(ids[t] | ids[:t]), differentiated with respect
   to the adapter's lora_A / lora_B tensors)

Run with a python that has torch (Debian: /usr/bin/python3 with python3-torch).
"""
import json
import math
import os
import struct
import sys

import torch

DT = torch.float64
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = bytearray(raw[base + a : base + b])
        t = torch.frombuffer(buf, dtype=ST_DTYPES[e["dtype"]]) if b > a else torch.zeros(0, dtype=ST_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(DT)
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


def inv_freq(cfg, head_dim):
    """modeling_rope_utils: _compute_default_rope_parameters and _compute_llama3_parameters."""
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=DT) / head_dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise SystemExit("reference: rope type %r is not implemented" % kind)
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv
    inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_llama / factor + smooth_factor * inv_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_llama)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Reference:
    def __init__(self, model_dir, adapter_dir=None, trainable=False):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = cfg = json.load(f)
        self.kind = cfg["model_type"]
        if self.kind not in ("qwen3", "qwen2", "llama"):
            raise SystemExit("reference: model_type %r is not implemented" % self.kind)
        self.w = read_weights(model_dir)
        self.H = cfg["hidden_size"]
        self.nq = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads") or self.nq
        self.D = cfg.get("head_dim") or self.H // self.nq
        self.eps = cfg["rms_norm_eps"]
        self.L = cfg["num_hidden_layers"]
        # Which projections carry a bias, as each modeling file builds its attention and MLP.
        attn_bias = bool(cfg.get("attention_bias", False))
        if self.kind == "qwen2":
            self.bias = {"q_proj": True, "k_proj": True, "v_proj": True, "o_proj": False}
        else:
            self.bias = {p: attn_bias for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        mlp_bias = self.kind == "llama" and bool(cfg.get("mlp_bias", False))
        self.bias.update({p: mlp_bias for p in ("gate_proj", "up_proj", "down_proj")})
        self.inv_freq = inv_freq(cfg, self.D)
        self.lora = {}
        if adapter_dir:
            with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
                ac = json.load(f)
            r, alpha = ac["r"], ac["lora_alpha"]
            self.lora_scale = alpha / math.sqrt(r) if ac.get("use_rslora") else alpha / r
            for name, t in read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors")).items():
                if not name.endswith(".weight") or (".lora_A" not in name and ".lora_B" not in name):
                    continue
                if trainable:
                    t.requires_grad_(True)
                self.lora[name] = t

    def linear(self, x, layer, module, proj):
        p = "model.layers.%d.%s.%s" % (layer, module, proj)
        y = x @ self.w[p + ".weight"].T
        if self.bias[proj]:
            y = y + self.w[p + ".bias"]
        a = self.lora.get("base_model.model." + p + ".lora_A.weight")
        if a is not None:
            b = self.lora["base_model.model." + p + ".lora_B.weight"]
            y = y + (x @ a.T) @ b.T * self.lora_scale
        return y

    def rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def logits(self, ids, attention_mask, position_ids):
        ids = torch.tensor(ids, dtype=torch.long)
        am = torch.tensor(attention_mask, dtype=torch.bool)
        pos = torch.tensor(position_ids, dtype=DT)
        B, T = ids.shape
        h = self.w["model.embed_tokens.weight"][ids]
        freqs = pos[..., None] * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [B, 1, T, D]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        allowed = causal[None, None] & am[:, None, None, :]  # [B, 1, T, T]
        rep = self.nq // self.nkv
        for i in range(self.L):
            p = "model.layers.%d." % i
            x = self.rms(h, self.w[p + "input_layernorm.weight"])
            q = self.linear(x, i, "self_attn", "q_proj").view(B, T, self.nq, self.D)
            k = self.linear(x, i, "self_attn", "k_proj").view(B, T, self.nkv, self.D)
            v = self.linear(x, i, "self_attn", "v_proj").view(B, T, self.nkv, self.D)
            if self.kind == "qwen3":
                q = self.rms(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, self.w[p + "self_attn.k_norm.weight"])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(rep, dim=1)  # repeat_kv: query head j uses kv head j // rep
            v = v.repeat_interleave(rep, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.D)
            s = s.masked_fill(~allowed, float("-inf"))
            a = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully padded query rows: ignored
            o = (a @ v).transpose(1, 2).reshape(B, T, self.nq * self.D)
            h = h + self.linear(o, i, "self_attn", "o_proj")
            x = self.rms(h, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(x, i, "mlp", "gate_proj")
            up = self.linear(x, i, "mlp", "up_proj")
            h = h + self.linear(torch.nn.functional.silu(gate) * up, i, "mlp", "down_proj")
        h = self.rms(h, self.w["model.norm.weight"])
        head = self.w["model.embed_tokens.weight"] if self.cfg.get("tie_word_embeddings", False) else self.w["lm_head.weight"]
        return h @ head.T  # [B, T, V]


def main():
    req = json.load(sys.stdin)
    grad = req.get("sft_grad")
    ref = Reference(req["model_dir"], req.get("adapter_dir"), trainable=bool(grad))
    out = {"cases": []}
    with torch.no_grad():
        for c in req.get("cases", []):
            lg = ref.logits(c["input_ids"], c["attention_mask"], c["position_ids"])
            rows = []
            for b, row in enumerate(c["attention_mask"]):
                rows.append([lg[b, t].tolist() if row[t] else None for t in range(len(row))])
            out["cases"].append({"logits": rows})
        out["greedy"] = []
        for g in req.get("greedy") or []:
            seq = list(g["prompt"])
            margins = []
            for _ in range(g["steps"]):
                last = ref.logits([seq], [[1] * len(seq)], [list(range(len(seq)))])[0, -1]
                top = torch.topk(last, 2).values
                margins.append(float(top[0] - top[1]))
                seq.append(int(torch.argmax(last)))
            out["greedy"].append({"tokens": seq[len(g["prompt"]) :], "margins": margins})
    if grad:
        ids, mask = grad["ids"], grad["mask"]
        lg = ref.logits([ids], [[1] * len(ids)], [list(range(len(ids)))])[0]
        logp = torch.log_softmax(lg[:-1], dim=-1)
        nll = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        m = torch.tensor(mask[1:], dtype=DT)
        loss = (nll * m).sum() / m.sum()
        loss.backward()
        out["sft_grad"] = {"loss": float(loss), "grads": {k: t.grad.reshape(-1).tolist() for k, t in ref.lora.items()}}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
