"""The real implementation as a reference: sentence-transformers' encode of a sentence-embedder folder.

Reads JSON on stdin: {"model_dir": str, "texts": [str]} and writes JSON: {"embeddings": base64 float32
[len(texts), dim], "dim", "tokens": [[ids]] (the model's tokenizer as SentenceTransformer.tokenize
feeds it, [CLS] and [SEP] included, cut at max_seq_length), "max_seq_length"}. The model runs on the
CPU in float32, as the folder's modules.json composes it (all-MiniLM-L6-v2: BERT, mean pooling, Normalize).
"""
import base64
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

req = json.load(sys.stdin)
model = SentenceTransformer(req["model_dir"], device="cpu", local_files_only=True)
texts = req["texts"]
emb = model.encode(texts, convert_to_numpy=True, batch_size=32).astype(np.float32)
tokens = [model.tokenize([t])["input_ids"][0].tolist() for t in texts]
json.dump(
    {
        "embeddings": base64.b64encode(emb.tobytes()).decode(),
        "dim": int(emb.shape[1]),
        "tokens": tokens,
        "max_seq_length": model.max_seq_length,
    },
    sys.stdout,
)
