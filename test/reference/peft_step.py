"""The real implementation of a LoRA step as a reference: transformers + PEFT + torch.optim.AdamW.

Reads JSON on stdin: {"model_dir", "adapter_dir" (a PEFT folder), "ids": [..], "mask": [..] (1 = trained
token), "lr", "betas": [b1, b2], "eps", "weight_decay"} and writes JSON: {"loss", "grads": {name: base64
float32}, "after": {name: base64 float32}} with PEFT's tensor names as saved (no ".default"), the SFT loss
being the mean over trained tokens t of -log p(ids[t] | ids[:t]) (labels -100 elsewhere, as HF computes it).
"""
import base64
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

req = json.load(sys.stdin)
model = AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=torch.float32)
model = PeftModel.from_pretrained(model, req["adapter_dir"], is_trainable=True)
model.train()  # the adapter's dropout is 0: train mode changes nothing else in these models
ids = torch.tensor([req["ids"]], dtype=torch.long)
labels = torch.tensor([[t if m else -100 for t, m in zip(req["ids"], req["mask"])]], dtype=torch.long)
loss = model(input_ids=ids, labels=labels).loss
loss.backward()
params = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
enc = lambda t: base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().tobytes()).decode()  # noqa: E731
grads = {n: enc(p.grad) for n, p in params.items()}
opt = torch.optim.AdamW(list(params.values()), lr=req["lr"], betas=tuple(req["betas"]), eps=req["eps"], weight_decay=req["weight_decay"])
opt.step()
json.dump({"loss": loss.item(), "grads": grads, "after": {n: enc(p) for n, p in params.items()}}, sys.stdout)
