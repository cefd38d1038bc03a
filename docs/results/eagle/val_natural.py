"""Teacher-forced accuracy of a trained head on held-out ShareGPT answers as written (records from
14,000, not regenerated): natural text, which a base model continues as text, whatever it would
write itself after a chat prompt.

    python docs/results/eagle/val_natural.py gemma3-270m runs/eagle3-gemma
    python docs/results/eagle/val_natural.py smollm2-135m runs/eagle3-smollm2-int8regen

The run folder holds a train-draft run's head/ and vocab.pt; the features go to <run>/val-natural."""
import sys
from pathlib import Path

import torch

from verispec import LLM
from verispec.train.features import FeatureOptions, build_features, load_shards, Manifest
from verispec.train.trainer import HeadModule, TrainOptions, draft_lm_head, head_config_for, validate
from verispec.models.registry import load_model
from verispec.models.eagle import default_aux_layers
from verispec.models.eagle_io import load_head
model, run = sys.argv[1], Path(sys.argv[2])
out = run / "val-natural"
w = load_model(model)
if Manifest.load(out).tokens < 20000:
    llm = LLM(model, batch_invariant=False, weights_format="float32", dtype="bfloat16", max_num_seqs=32)
    build_features(llm, FeatureOptions(data="sharegpt", start=14000, stop=24000, regenerate=False, tokens=20000, max_answer=256), out,
                   default_aux_layers(w.config.num_layers))
val = load_shards(out)
_, hw = load_head(str(run / "head"), w.config.hidden_size, w.config.vocab_size)
vocab = torch.load(run / "vocab.pt", weights_only=True)
draft_lm = draft_lm_head(w.weights, vocab["d2t"])
m = HeadModule(head_config_for(w.config, len(vocab["d2t"])), w.weights["embed.weight"].float(), vocab["d2t"], vocab["t2d"], 0,
               {k: v for k, v in hw.items() if k not in ("d2t", "t2d")})
print(model, run, "natural held-out", len(val), "conversations:", [round(a, 3) for a in validate(m, val, TrainOptions(batch_tokens=2048), draft_lm)])
