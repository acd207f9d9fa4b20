"""The train benchmark's peer: the same LoRA step in PyTorch 2 + transformers + PEFT, as a user of those
libraries would run it. One configuration per process (peak RSS its own). Prints one JSON line.

argv: model_dir checkpoint(0|1) seq_len reps threads [warmup]: warmup steps (default 1) run first and are not
timed; the median of the next reps is printed.
The step: r 16 / alpha 32 LoRA on all seven projections (dropout 0), float32, one sequence of seq_len
tokens whose last 3/4 are trained (labels -100 before), the loss transformers computes from labels,
backward, torch.optim.AdamW (lr 1e-5); gradient checkpointing as transformers enables it.
"""
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


model_dir, ckpt, seq_len, reps, threads = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
warmup = int(sys.argv[6]) if len(sys.argv) > 6 else 1
torch.set_num_threads(threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets))
if ckpt:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
seq = [((i * 7919) % 100000) + 100 for i in range(seq_len)]
ids = torch.tensor([seq], dtype=torch.long)
labels = torch.tensor([[t if i >= seq_len / 4 else -100 for i, t in enumerate(seq)]], dtype=torch.long)
before = kib("VmRSS")
times = []
for r in range(warmup + reps):
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if r >= warmup:
        times.append(time.perf_counter() - t0)
print(
    json.dumps(
        {
            "step_s": statistics.median(times),
            "steps_warmup": warmup,
            "steps_timed": len(times),
            "peak_MiB": kib("VmHWM"),
            "loaded_MiB": before,
            "torch": torch.__version__,
            "loss": loss.item(),
        }
    )
)
