"""One PPO update with a separate critic, as verl's dp_actor / dp_critic compute it (Search-R1's
trainer), on transformers + PEFT + torch.optim.AdamW: the reference for test/ppo-critic.test.ts.

The actor (a PEFT model from actor_dir) trains on the clipped policy loss alone, the critic (a second
PEFT model from critic_dir, with a linear value head on its final hidden states, as verl's
AutoModelForTokenClassification critic) on the clipped value loss alone; each clips its own
gradient norm (torch.nn.utils.clip_grad_norm_) and steps its own AdamW at its own rate.
Token means over the batch's trained tokens (verl's masked_mean over the mini-batch).

Request (JSON on stdin):
  {"model_dir", "actor_dir", "critic_dir", "value_head": {"weight": [H], "bias": [1]},
   "sequences": [[ids]], "masks", "advantages", "old_logprobs", "returns", "old_values": [[per token]]
   (index t <-> token t; token t is predicted from position t - 1),
   "clip_low", "clip_high", "value_clip", "betas", "eps", "weight_decay",
   "actor": {"lr", "max_grad_norm"}, "critic": {"lr", "max_grad_norm"}}
Reply (JSON on stdout):
  {"values": [[critic value per token, 0 at t = 0]], "actor_trunk_values": [[the value head on the
   actor's hidden states]], "actor": {"loss", "grad_norm", "grads", "after"}, "critic": {...}} with
  tensors as base64 float32 under PEFT's saved names (no ".default"); the critic's adapter names get
  a "critic." prefix, the head is value_head.weight / value_head.bias.
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
enc = lambda t: base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().tobytes()).decode()  # noqa: E731


def peft(adapter_dir):
    base = AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=torch.float32)
    m = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    m.train()  # the adapters' dropout is 0: train mode changes nothing else
    return m


def hidden(m, ids):
    # The final hidden states (after the last norm), [T, H].
    return m.get_base_model().model(input_ids=torch.tensor([ids])).last_hidden_state[0]


def rows(key):
    return [torch.tensor(r, dtype=torch.float32) for r in req[key]]


seqs, masks = req["sequences"], rows("masks")
adv, old_lp, ret, old_v = rows("advantages"), rows("old_logprobs"), rows("returns"), rows("old_values")
tokens = sum(float(m[1:].sum()) for m in masks)


def step(params, loss, o):
    loss.backward()
    names = list(params)
    grads = {n: params[n].grad.detach().clone() for n in names}
    norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm=o["max_grad_norm"])
    opt = torch.optim.AdamW(
        [params[n] for n in names], lr=o["lr"], betas=tuple(req["betas"]), eps=req["eps"], weight_decay=req["weight_decay"]
    )
    opt.step()
    return {
        "loss": loss.item(),
        "grad_norm": float(norm),
        "grads": {n: enc(g) for n, g in grads.items()},
        "after": {n: enc(params[n]) for n in names},
    }


def named(m, prefix=""):
    return {prefix + n.replace(".default", ""): p for n, p in m.named_parameters() if p.requires_grad}


# The actor: verl's compute_policy_loss, max(-A r, -A clip(r, 1 - cl, 1 + ch)), token mean.
actor = peft(req["actor_dir"])
pg = torch.zeros(())
for i, ids in enumerate(seqs):
    lp = torch.log_softmax(actor(input_ids=torch.tensor([ids])).logits[0, :-1], -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    r = torch.exp(lp - old_lp[i][1:])
    a = adv[i][1:]
    loss = torch.maximum(-a * r, -a * torch.clamp(r, 1 - req["clip_low"], 1 + req["clip_high"]))
    pg = pg + (loss * masks[i][1:]).sum() / tokens

# The critic: its own adapter's hidden states through the value head; verl's compute_value_loss.
critic = peft(req["critic_dir"])
H = len(req["value_head"]["weight"])
head = torch.nn.Linear(H, 1)
with torch.no_grad():
    head.weight.copy_(torch.tensor(req["value_head"]["weight"]).view(1, H))
    head.bias.copy_(torch.tensor(req["value_head"]["bias"]))
with torch.no_grad():
    before = lambda m: [[0.0] + head(hidden(m, ids)[:-1]).squeeze(-1).tolist() for ids in seqs]  # noqa: E731
    values, actor_trunk = before(critic), before(actor)
vf = torch.zeros(())
for i, ids in enumerate(seqs):
    v = head(hidden(critic, ids)[:-1]).squeeze(-1)
    vc = torch.clamp(v, old_v[i][1:] - req["value_clip"], old_v[i][1:] + req["value_clip"])
    loss = 0.5 * torch.maximum((v - ret[i][1:]) ** 2, (vc - ret[i][1:]) ** 2)
    vf = vf + (loss * masks[i][1:]).sum() / tokens

out = {"values": values, "actor_trunk_values": actor_trunk}
out["actor"] = step(named(actor), pg, req["actor"])
out["critic"] = step({**named(critic, "critic."), "value_head.weight": head.weight, "value_head.bias": head.bias}, vf, req["critic"])
json.dump(out, sys.stdout)
