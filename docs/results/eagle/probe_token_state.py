"""Probe (2026-12-07): does the EAGLE-3 head predict better when it reads the target's own
layer-2 input at p + 1 (the low fused state of the token it conditions on, which drafting would
get by running the target's first two layers on each draft token) instead of that token's
embedding? Teacher-forced, same data, seed and steps in both arms:

    python docs/results/eagle/probe_token_state.py base 400
    python docs/results/eagle/probe_token_state.py low 400

Needs the features of runs/eagle3-smollm2-int8regen (docs/results/eagle/README.md, seventh session)."""
import inspect
import random
import sys
import time
from pathlib import Path
import torch
from verispec.train import trainer
from verispec.train.features import load_shards
from verispec.train.trainer import HeadModule, TrainOptions, draft_lm_head, head_config_for, train
from verispec.models.registry import load_model

arm, steps = sys.argv[1], int(sys.argv[2])
run = Path("runs/eagle3-smollm2-int8regen")
ex, val = load_shards(run / "features"), load_shards(run / "val-features")
w = load_model("smollm2-135m")
H = w.config.hidden_size
if arm == "low":
    src = inspect.getsource(trainer.ttt_loss)
    old = "e = F.embedding(tokens[:, 1:], module.embed_weight)"
    assert old in src
    src = src.replace(old, "e = aux[:, 1:, :%d].float()" % H)
    exec(src, trainer.__dict__)
vocab = torch.load(run / "vocab.pt", weights_only=True)
draft_lm = draft_lm_head(w.weights, vocab["d2t"])
cfg = head_config_for(w.config, len(vocab["d2t"]))
init = {"lm_head.weight": draft_lm, "norm.weight": w.weights["norm.weight"].float()}
m = HeadModule(cfg, w.weights["embed.weight"].float(), vocab["d2t"], vocab["t2d"], 0, init)
opts = TrainOptions(batch_tokens=2048, train_lm_head=False, val_every=100)
nb = len(trainer.make_batches(ex, opts, random.Random(0)))
opts.epochs = steps / nb
out = Path(f"runs/probe-token-state-{arm}")
out.mkdir(parents=True, exist_ok=True)
for old_file in out.glob("*"):  # a fresh run each time
    old_file.unlink()
t = time.time()
last = train(m, ex, opts, out, draft_lm, val)
print(arm, "steps", last["step"], "val", last.get("val_acc"), "s", round(time.time() - t))
