"""The real implementation as a reference: transformers' own forward and greedy generation.

Reads JSON on stdin: {"model_dir", "dtype": "float32"|"bfloat16", "rows": [[ids]], "greedy": [{"prompt": [ids], "steps": n}],
"texts": [str], "chats": [[{role, content}]]} and writes JSON: {"logits": [base64 float32 [T, V] per row], "vocab",
"greedy": [[ids]], "tokens": [[ids]] (the tokenizer's encode of each text, no special tokens added), "rendered": [str]
(apply_chat_template with the generation prompt)}.
Rows are unpadded (one forward each). Greedy decoding is transformers' generate(do_sample=False).
"""
import base64
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

req = json.load(sys.stdin)
torch.manual_seed(0)
dtype = getattr(torch, req.get("dtype", "float32"))
model = AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=dtype).eval()
out = {"logits": [], "greedy": [], "vocab": model.config.vocab_size}
with torch.no_grad():
    for row in req.get("rows", []):
        ids = torch.tensor([row], dtype=torch.long)
        logits = model(input_ids=ids).logits[0].to(torch.float32).contiguous().numpy()
        out["logits"].append(base64.b64encode(logits.tobytes()).decode())
    for g in req.get("greedy", []):
        ids = torch.tensor([g["prompt"]], dtype=torch.long)
        r = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=g["steps"],
            do_sample=False,
            pad_token_id=model.config.eos_token_id,
        )
        out["greedy"].append(r[0, len(g["prompt"]) :].tolist())
if req.get("texts") or req.get("chats"):
    tok = AutoTokenizer.from_pretrained(req["model_dir"])
    out["tokens"] = [tok.encode(t, add_special_tokens=False) for t in req.get("texts", [])]
    out["rendered"] = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in req.get("chats", [])]
json.dump(out, sys.stdout)
