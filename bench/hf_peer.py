"""The GPU check's benchmark peer (issue 35, item 1): transformers' own generate, forward and a PEFT LoRA
step on a random model of the shape gpu_check benchmarks (scripts/gpu-check.sh --bench), in bfloat16, on
the same device, measured the way gpu_check measures its own rows. Prints one JSON object.

argv: shape (4b | tiny) device (cpu | cuda[:N])

The model: Qwen3ForCausalLM from a Qwen3Config of the shape (transformers' own random initialisation;
speed does not depend on the values), tied head, bfloat16, eval mode for generation.
  decode_b1 / decode_batch: model.generate on one prompt / `questions` prompts each repeated k times
    (num_return_sequences), do_sample at temperature 1, min_new_tokens = max_new_tokens (every row runs
    the same number of steps as gpu_check's rows, which have no stop token); one warm-up call first;
    step_ms = (wall time - the prefill's time, measured apart) / steps, as gpu_check reports its own,
    the wall time the median of 3 calls.
  prefill_short / prefill_long: model(input_ids, logits_to_keep=1) under no_grad, median of 3 after a
    warm-up.
  lora_step: PEFT r 16 / alpha 32 on q/k/v/o (dropout 0), gradient checkpointing as transformers
    enables it (use_reentrant False), one sequence whose last 3/4 are trained, the loss transformers
    computes from labels, backward, clip to norm 1, torch.optim.AdamW; median of 3 after a warm-up;
    peak_bytes = torch.cuda.max_memory_allocated over the timed steps.
"""
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

SHAPES = {
    # layers, hidden, inter, heads, kv_heads, head_dim, vocab, prompt, new_tokens, prefill_short, prefill_long, train_seq, k, questions
    "4b": (36, 2560, 9728, 32, 8, 128, 151936, 512, 256, 512, 3000, 3000, 24, 2),
    "tiny": (4, 256, 768, 4, 2, 64, 4096, 64, 32, 64, 256, 256, 4, 2),
}
shape, device = sys.argv[1], sys.argv[2]
L, H, I, NH, NKV, HD, V, PROMPT, NEW, PS, PL, TS, K, Q = SHAPES[shape]
dev = torch.device(device)
cuda = dev.type == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def reset_peak():
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)


def peak():
    if cuda:
        return float(torch.cuda.max_memory_allocated(dev))
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    return float("nan")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


torch.manual_seed(0)
cfg = Qwen3Config(
    vocab_size=V,
    hidden_size=H,
    intermediate_size=I,
    num_hidden_layers=L,
    num_attention_heads=NH,
    num_key_value_heads=NKV,
    head_dim=HD,
    tie_word_embeddings=True,
    max_position_embeddings=max(PL, TS, PROMPT + NEW) + 8,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
)
with torch.device(dev):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.eval()
out = {
    "name": f"transformers {transformers.__version__} (torch {torch.__version__})",
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "shape": shape,
    "device": device,
    "attn_implementation": model.config._attn_implementation,
}


def prompt_ids(q, n):
    return [((q * 131 + i) * 7919) % (V - 200) + 100 for i in range(n)]


def prefill_ms(ids):
    with torch.no_grad():
        ts = []
        for i in range(4):
            sync()
            t0 = time.perf_counter()
            model(input_ids=ids, logits_to_keep=1)
            sync()
            if i > 0:
                ts.append(time.perf_counter() - t0)
    return median(ts)


def decode(questions, k):
    ids = torch.tensor([prompt_ids(q, PROMPT) for q in range(questions)], device=dev)
    kw = dict(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        num_return_sequences=k,
        pad_token_id=0,
        eos_token_id=None,
    )
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up
        pre = prefill_ms(ids.repeat_interleave(k, dim=0))
        reset_peak()
        walls = []
        for _ in range(3):  # the median of 3, as the prefill's: one stalled call on a shared machine moves neither
            sync()
            t0 = time.perf_counter()
            o = model.generate(ids, **kw)
            sync()
            walls.append(time.perf_counter() - t0)
        wall = median(walls)
    gen = int((o.shape[1] - PROMPT) * o.shape[0])
    steps = o.shape[1] - PROMPT - 1
    return {
        "batch": int(o.shape[0]),
        "prompt": PROMPT,
        "new_tokens": NEW,
        "generated": gen,
        "row_latency_s": wall,
        "step_ms": (wall - pre) / max(1, steps) * 1e3,
        "tokens_per_s": gen / wall,
        "peak_bytes": peak(),
    }


out["decode_b1"] = decode(1, 1)
out["decode_batch"] = decode(Q, K)
for key, T in (("prefill_short", PS), ("prefill_long", PL)):
    reset_peak()
    t = prefill_ms(torch.tensor([prompt_ids(0, T)], device=dev))
    out[key] = {"tokens": T, "ms": t * 1e3, "peak_bytes": peak()}

try:
    from peft import LoraConfig, get_peft_model  # noqa: E402
    import peft  # noqa: E402

    pm = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    pm.enable_input_require_grads()
    pm.train()
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    seq = [(i * 7919) % (V - 200) + 100 for i in range(TS)]
    ids = torch.tensor([seq], device=dev)
    labels = torch.tensor([[t if i >= TS // 4 else -100 for i, t in enumerate(seq)]], device=dev)
    ts = []
    for r in range(4):
        if r == 1:
            reset_peak()
        sync()
        t0 = time.perf_counter()
        loss = pm(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if r > 0:
            ts.append(time.perf_counter() - t0)
    out["lora_step"] = {"tokens": TS, "ms": median(ts) * 1e3, "peak_bytes": peak(), "loss": loss.item(), "peft": peft.__version__}
except ImportError as e:
    out["lora_step_error"] = f"peft not importable: {e}"
print(json.dumps(out))
