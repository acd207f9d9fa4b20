"""The train benchmark's GRPO peer: one step of TRL's GRPOTrainer (K completions of one prompt, the
reward, the update) on the bench's model, as a user of TRL would run it. One configuration per
process (peak RSS its own). Prints one JSON line.

argv: model_dir prompt_len completion_len K reps threads
The step: r 16 / alpha 32 LoRA on all seven projections (dropout 0), float32 on the CPU, the prompt
the same token ids as bench/grpo-child.ts's, K = num_generations = per-device batch (one prompt a
step, one update a step: gradient accumulation 1, num_iterations 1), completions of exactly
completion_len tokens (min_new_tokens = max_completion_length), temperature 1, a deterministic
reward, learning rate 1e-5, max_grad_norm 1, beta 0 (no reference model: TRL's default), TRL's
default loss, gradient checkpointing on (slm-train's default), no vLLM, no logging.
The preset has no tokenizer: a word-level one maps the word "t<id>" to token id <id>, so the
prompt's text is exactly its ids (no chat template).
"""
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


model_dir, P, C, K, reps, threads = sys.argv[1], *map(int, sys.argv[2:7])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = AutoConfig.from_pretrained(model_dir)
tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
eos = f"t{cfg.eos_token_id}"
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos, padding_side="left")
prompt_ids = [((i * 7919) % 100000) + 100 for i in range(P)]  # bench/grpo-child.ts's prompt
prompt = " ".join(f"t{i}" for i in prompt_ids)
assert tokenizer(prompt)["input_ids"] == prompt_ids
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
loaded = mib("VmRSS")
lengths = []


def reward(completions, **_):
    lengths.extend(len(c.split()) for c in completions)
    return [float(sum(map(ord, c)) % 7) for c in completions]  # deterministic, varies across the group


args = GRPOConfig(
    output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"trl-grpo-{os.getpid()}"),
    use_cpu=True,
    bf16=False,
    fp16=False,
    report_to="none",
    disable_tqdm=True,
    logging_steps=1,
    save_strategy="no",
    max_steps=reps + 1,
    seed=0,
    dataloader_num_workers=0,
    per_device_train_batch_size=K,
    num_generations=K,
    gradient_accumulation_steps=1,
    num_iterations=1,
    max_completion_length=C,
    generation_kwargs={"min_new_tokens": C},
    temperature=1.0,
    top_p=1.0,
    learning_rate=1e-5,
    max_grad_norm=1.0,
    beta=0.0,
    use_vllm=False,
    gradient_checkpointing=True,
    gradient_checkpointing_kwargs={"use_reentrant": False},
)
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
trainer = GRPOTrainer(
    model=model,
    reward_funcs=reward,
    args=args,
    processing_class=tokenizer,
    train_dataset=Dataset.from_dict({"prompt": [prompt] * (K * (reps + 2))}),
    peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"),
)
gen_times, score_times, step_times = [], [], []


def timed(fn, sink):
    def run(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        sink.append(time.perf_counter() - t0)
        return out

    return run


trainer._generate = timed(trainer._generate, gen_times)
trainer._generate_and_score_completions = timed(trainer._generate_and_score_completions, score_times)


class Clock(TrainerCallback):
    def on_step_begin(self, *_a, **_k):
        self.t0 = time.perf_counter()

    def on_step_end(self, *_a, **_k):
        step_times.append(time.perf_counter() - self.t0)


trainer.add_callback(Clock())
trainer.train()
logs = [h for h in trainer.state.log_history if "loss" in h]
med = lambda xs: sorted(xs[1:])[len(xs[1:]) // 2] if len(xs) > 1 else xs[0]  # noqa: E731 (the first step warms up)
print(
    json.dumps(
        {
            "step_s": med(step_times),
            "generate_s": med(gen_times),
            "score_s": med([s - g for s, g in zip(score_times, gen_times)]),  # reward + log-prob passes, inside update_s
            "update_s": med([t - g for t, g in zip(step_times, gen_times)]),
            "steps": len(step_times),
            "completion_tokens": sorted(set(lengths)),
            "rows": K,
            "prompt_tokens": P,
            "peak_MiB": mib("VmHWM"),
            "loaded_MiB": loaded,
            "trl": trl.__version__,
            "torch": torch.__version__,
            "loss": logs[-1]["loss"] if logs else None,
        }
    )
)
