"""Training an EAGLE-3 head on the target's stored features (train/features.py).

The recipe (the EAGLE repository's and SpecForge's, sized for a CPU):
- the target frozen; the head reads its token embeddings (frozen) and fused states;
- draft vocabulary: the `draft_vocab` tokens the target itself predicts most often in the answers;
- the head's LM head and final norm start as the target's own (its LM head's draft-vocabulary rows,
  its final norm: `init_from_target`), so its output starts in the space the target predicts from;
- the training-time test: `ttt_steps` unrolled steps; at step s the row at position p reads the
  head's own step s - 1 output at p - 1 and attends to the real rows up to its anchor p - s and to
  the chain's draft rows (one per earlier step), exactly what drafting at inference sees;
- soft cross-entropy against the target's distribution renormalised over the draft vocabulary, on
  the rows that predict answer tokens, step s weighted `step_weight ** s`;
- AdamW (0.9, 0.95), linear warm-up then cosine decay, gradient clipping at 1;
- optionally the LM head and final norm frozen at the target's (`train_lm_head=False`): half the
  weights of a small target's head are its LM head, which otherwise learns the training set;
- held-out teacher-forced accuracy (conversations the head never trains on) every `val_every`
  steps, logged beside the training accuracy: the gap between the two is overfitting;
- bfloat16 autocast for the products (the weights stay float32); checkpoints every few minutes,
  from which a stopped run resumes with its optimizer, schedule and data order.

Shapes: B sequences of T tokens, R = T - 1 rows (row p reads token p + 1), H the head's width.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec.errors import ConfigError
from verispec.models.config import RopeConfig
from verispec.models.heads.eagle import HeadConfig, after_attention, embed_and_state, logits, qkv
from verispec.models.decoder.transformer import RopeTable


@dataclass
class TrainOptions:
    draft_vocab: int = 8192
    ttt_steps: int = 3
    step_weight: float = 0.8
    lr: float = 6e-4
    warmup: int = 50
    batch_tokens: int = 4096  # padded tokens per optimizer step
    max_len: int = 768  # examples are cut to this many tokens
    epochs: float = 3.0
    minutes: float | None = None  # stop this stretch after so many minutes (a checkpoint is saved)
    checkpoint_minutes: float = 5.0
    seed: int = 0
    bf16: bool = True
    init_from_target: bool = True  # lm_head and norm start as the target's (else random / ones)
    train_lm_head: bool = True  # False: lm_head and norm stay as they start (the target's, with init_from_target)
    val_every: int = 100  # steps between held-out accuracy checks (and one at the end)


class HeadModule(torch.nn.Module):
    """The head's trainable weights under their published names (dots as '__' for nn)."""

    def __init__(self, config: HeadConfig, embed: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor, seed: int,
                 init: dict[str, torch.Tensor] | None = None) -> None:
        """init: published name -> a tensor to start that weight from (copied)."""
        super().__init__()
        c = config
        H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
        g = torch.Generator().manual_seed(seed)
        shapes = {
            "fc.weight": (H, c.state_width),
            "midlayer.self_attn.q_proj.weight": (c.num_heads * D, 2 * H),
            "midlayer.self_attn.k_proj.weight": (c.num_kv_heads * D, 2 * H),
            "midlayer.self_attn.v_proj.weight": (c.num_kv_heads * D, 2 * H),
            "midlayer.self_attn.o_proj.weight": (H, c.num_heads * D),
            "midlayer.mlp.gate_proj.weight": (I, H),
            "midlayer.mlp.up_proj.weight": (I, H),
            "midlayer.mlp.down_proj.weight": (H, I),
            "lm_head.weight": (c.draft_vocab_size, H),
        }
        self.params = torch.nn.ParameterDict()
        for name, shape in shapes.items():
            self.params[name.replace(".", "__")] = torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.02)
        for name in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                     "midlayer.post_attention_layernorm.weight", "norm.weight"):
            self.params[name.replace(".", "__")] = torch.nn.Parameter(torch.ones(H))
        for name, value in (init or {}).items():
            param = self.params[name.replace(".", "__")]
            if value.shape != param.shape:
                raise ValueError(f"{name}: cannot start from a tensor of shape {tuple(value.shape)}, the head's is {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(value)
        self.config = config
        self.embed_weight = embed  # [vocab, H] frozen
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.rope = RopeTable(config.rope, config.head_dim)

    @property
    def w(self) -> dict[str, torch.Tensor]:
        return {k.replace("__", "."): v for k, v in self.params.items()}

    def weights(self) -> dict[str, torch.Tensor]:
        """Published names -> tensors, d2t and t2d included (what eagle_io.save_head writes)."""
        return {**{k: v.detach() for k, v in self.w.items()}, "d2t": self.d2t, "t2d": self.t2d}


class _View:
    """What models/heads/eagle.py's shared pieces read: config, w, lm_head."""

    def __init__(self, module: HeadModule) -> None:
        self.config = module.config
        self.w = module.w
        self.lm_head = self.w["lm_head.weight"]


def ttt_loss(module: HeadModule, batch: dict, steps: int, step_weight: float, draft_lm: torch.Tensor):
    """The training-time test over a padded batch; returns (loss, KL above the target's entropy,
    per-step accuracy [steps], rows)."""
    head = _View(module)
    c = module.config
    tokens, aux, hidden, valid = batch["tokens"], batch["aux"], batch["hidden"], batch["valid"]
    B, T = tokens.shape
    R = T - 1
    e = F.embedding(tokens[:, 1:], module.embed_weight)  # [B, R, H]: row p reads token p + 1
    with torch.no_grad():  # soft labels: the target's distribution at p + 1 over the draft vocabulary
        target = torch.softmax(F.linear(hidden[:, 1:][valid].float(), draft_lm).float(), -1)  # [valid rows, dv]
        entropy = -(target * torch.log(target.clamp_min(1e-30))).sum(-1)  # [valid rows]: the loss's floor
    cos, sin = module.rope.get(0, R)
    g = c.num_heads // c.num_kv_heads
    scale = c.head_dim ** -0.5
    pos = torch.arange(R)
    state, fused = aux[:, :R], True
    k0 = v0 = None
    chain: list[tuple[torch.Tensor, torch.Tensor]] = []  # keys, values of draft steps 1..s
    total = torch.zeros(())
    kl = 0.0  # the loss above its floor (the target's entropy): what training can remove
    accs = []
    for s in range(steps):
        x, residual = embed_and_state(head, state, e, fused)
        q, k, v = qkv(head, x, cos, sin)  # [B, R, heads, D], [B, R, kv, D] x 2
        q = q.transpose(1, 2)  # [B, heads, R, D]
        k = k.repeat_interleave(g, dim=2).transpose(1, 2)
        v = v.repeat_interleave(g, dim=2).transpose(1, 2)
        if s == 0:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # [B, heads, R, D]
            k0, v0 = k, v
        else:
            chain.append((k, v))
            blocked = pos[None, :] > (pos[:, None] - s)  # real keys only up to the anchor p - s
            cols = [(q @ k0.transpose(-1, -2) * scale).masked_fill(blocked, float("-inf"))]  # [B, heads, R, R]
            shifted = []
            for j, (kj, vj) in enumerate(chain, start=1):  # the chain's step-j row sits at p - (s - j)
                shift = s - j
                kj_s, vj_s = _shift(kj, shift), _shift(vj, shift)
                d = (q * kj_s).sum(-1, keepdim=True) * scale  # [B, heads, R, 1]
                cols.append(d.masked_fill((pos < shift)[:, None], float("-inf")))
                shifted.append(vj_s)
            probs = torch.softmax(torch.cat(cols, -1), -1)
            attn = probs[..., :R] @ v0
            for j, vj_s in enumerate(shifted):
                attn = attn + probs[..., R + j : R + j + 1] * vj_s
        attn = attn.transpose(1, 2).reshape(B, R, c.num_heads * c.head_dim)
        pre = after_attention(head, attn, residual)  # [B, R, H]
        rows = valid & (pos >= s)[None, :]  # [B, R]: rows with an anchor that predict answer tokens
        out = logits(head, pre[rows]).float()  # [n, dv]
        ce_rows = -(target[rows[valid]] * torch.log_softmax(out, -1)).sum(-1)  # [n]
        ce = ce_rows.mean()
        total = total + step_weight ** s * ce
        kl += step_weight ** s * float((ce_rows.detach() - entropy[rows[valid]]).mean())
        drafted = out.argmax(-1)  # [n] draft ids
        hit = drafted + module.d2t[drafted] == batch["argmax"][rows]
        accs.append(float(hit.float().mean()) if hit.numel() else 0.0)
        state = _shift(pre, 1, dim=1)  # the next step's row p reads this step's output at p - 1
        fused = False
    return total, kl, accs, int(valid.sum())


def _shift(x: torch.Tensor, n: int, dim: int = 2) -> torch.Tensor:
    """x moved n places later along dim (zeros in front)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x.narrow(dim, 0, n))
    return torch.cat([pad, x.narrow(dim, 0, x.shape[dim] - n)], dim)


def choose_draft_vocab(examples: list[dict], size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` tokens the target predicts most often in the answers -> (d2t [size], t2d [vocab])."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for ex in examples:
        counts += torch.bincount(ex["argmax"].long(), minlength=vocab)
    ids = counts.topk(size).indices.sort().values  # [size] target ids, ascending
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


def draft_lm_head(weights: dict[str, torch.Tensor], d2t: torch.Tensor) -> torch.Tensor:
    """The target's LM head rows of the draft vocabulary, float32 [draft_vocab, H] (tied heads: the
    embedding's rows); `weights` a loaded target's tensors by name."""
    lm = weights.get("lm_head.weight", weights["embed.weight"])
    return lm[torch.arange(len(d2t)) + d2t].float()


def make_batches(examples: list[dict], opts: TrainOptions, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length, at most batch_tokens padded tokens each, in random order."""
    order = sorted(range(len(examples)), key=lambda i: (min(len(examples[i]["tokens"]), opts.max_len), rng.random()))
    batches, cur, longest = [], [], 0
    for i in order:
        n = min(len(examples[i]["tokens"]), opts.max_len)
        if cur and max(longest, n) * (len(cur) + 1) > opts.batch_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples: list[dict], idx: list[int], max_len: int, dtype: torch.dtype = torch.float32) -> dict:
    """Right-padded tensors; valid[b, p]: row p predicts an answer token (p + 2 >= answer start)."""
    T = min(max_len, max(len(examples[i]["tokens"]) for i in idx))
    B = len(idx)
    first = examples[idx[0]]
    tokens = torch.zeros(B, T, dtype=torch.int64)
    aux = torch.zeros(B, T, first["aux"].shape[1], dtype=dtype)
    hidden = torch.zeros(B, T, first["hidden"].shape[1])  # float32: examples may mix float16 and bfloat16
    argmax = torch.full((B, T - 1), -1, dtype=torch.int64)  # [B, R]: the target's token after row p's token
    valid = torch.zeros(B, T - 1, dtype=torch.bool)
    for b, i in enumerate(idx):
        ex = examples[i]
        n = min(len(ex["tokens"]), T)
        tokens[b, :n] = ex["tokens"][:n].long()
        aux[b, :n] = ex["aux"][:n]
        hidden[b, :n] = ex["hidden"][:n]
        a0 = ex["answer_start"]
        lo = max(0, a0 - 2)  # row p predicts token p + 2 from position p + 1's distribution
        hi = n - 1  # rows p <= n - 2
        if hi > lo:
            valid[b, lo:hi] = True
            rows = torch.arange(lo, hi)
            argmax[b, lo:hi] = ex["argmax"][rows + 2 - a0].long()
    return {"tokens": tokens, "aux": aux, "hidden": hidden, "argmax": argmax, "valid": valid}


def estimated_accept_length(accs: list[float]) -> float:
    """1 + a1 + a1 a2 + ...: the mean accepted length per step if step s is right with probability
    a_s given the earlier ones were (teacher-forced accuracies stand in for those conditionals)."""
    total, run = 1.0, 1.0
    for a in accs:
        run *= a
        total += run
    return total


def head_config_for(target_config, draft_vocab: int) -> HeadConfig:
    c = target_config
    return HeadConfig(
        kind="eagle3", hidden_size=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
        head_dim=c.hidden_size // c.num_heads if c.hidden_size % c.num_heads == 0 else c.head_dim,
        intermediate_size=c.intermediate_size, rms_eps=c.rms_eps, rope=RopeConfig(c.rope.theta), vocab_size=c.vocab_size,
        draft_vocab_size=draft_vocab, target_hidden_size=c.hidden_size,
    )


def _batch(examples: list[dict], idx: list[int], opts: TrainOptions) -> dict:
    return collate(examples, idx, opts.max_len, torch.bfloat16 if opts.bf16 else torch.float32)


def _ttt(module: HeadModule, batch: dict, opts: TrainOptions, draft_lm: torch.Tensor):
    """ttt_loss under the options' precision: what training and validation both run."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=opts.bf16):
        return ttt_loss(module, batch, opts.ttt_steps, opts.step_weight, draft_lm)


@torch.no_grad()
def validate(module: HeadModule, examples: list[dict], opts: TrainOptions, draft_lm: torch.Tensor) -> list[float]:
    """Teacher-forced accuracy per draft step over `examples` (every answer row counted once)."""
    hits, rows = [0.0] * opts.ttt_steps, 0
    for idx in make_batches(examples, opts, random.Random(0)):
        _, _, accs, n = _ttt(module, _batch(examples, idx, opts), opts, draft_lm)
        hits = [h + a * n for h, a in zip(hits, accs)]
        rows += n
    return [h / max(1, rows) for h in hits]


def _held_out(module: HeadModule, examples: list[dict], opts: TrainOptions, draft_lm: torch.Tensor) -> dict:
    """The progress record's held-out fields."""
    acc = validate(module, examples, opts, draft_lm)
    return {"val_acc": acc, "val_est_accept": estimated_accept_length(acc)}


FROZEN_WITHOUT_LM_HEAD = ("lm_head.weight", "norm.weight")


def train(module: HeadModule, examples: list[dict], opts: TrainOptions, folder: Path, draft_lm: torch.Tensor,
          val_examples: list[dict] | None = None, log=print) -> dict:
    """Train (or resume) in `folder`: ckpt.pt, log.jsonl. Returns the last progress record."""
    from tqdm import tqdm

    torch.manual_seed(opts.seed)
    for name, param in module.params.items():
        param.requires_grad_(opts.train_lm_head or name.replace("__", ".") not in FROZEN_WITHOUT_LM_HEAD)
    trainable = [p for p in module.params.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.0)
    epoch_batches = make_batches(examples, opts, random.Random(opts.seed))
    total_steps = max(1, int(len(epoch_batches) * opts.epochs))
    state = {"step": 0, "seconds": 0.0, "tokens": 0}
    ckpt = folder / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        was = saved.get("options", {}).get("train_lm_head", True)
        if was != opts.train_lm_head:
            raise ConfigError(f"{ckpt} was trained with the LM head {'trained' if was else 'frozen'}; resume with "
                              f"--{'' if was else 'no-'}train-lm-head or start a new run folder")
        module.params.load_state_dict(saved["params"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        log(f"resumed at step {state['step']} of {total_steps} ({state['seconds'] / 60:.1f} min trained so far)")

    def lr_at(step: int) -> float:
        if step < opts.warmup:
            return opts.lr * (step + 1) / opts.warmup
        return opts.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - opts.warmup) / max(1, total_steps - opts.warmup))))

    def save() -> None:
        torch.save({"params": module.params.state_dict(), "opt": opt.state_dict(), "state": state,
                    "options": asdict(opts)}, folder / "ckpt.pt.tmp")
        (folder / "ckpt.pt.tmp").rename(ckpt)

    logf = (folder / "log.jsonl").open("a")
    bar = tqdm(total=total_steps, initial=state["step"], desc="train head", unit="step")
    stretch_start = time.perf_counter()
    last_save = time.perf_counter()
    smooth: dict = {}
    record: dict = {}
    while state["step"] < total_steps:
        epoch, within = divmod(state["step"], len(epoch_batches))
        if state.get("order_epoch") != epoch:  # each epoch's batch order, kept in the checkpoint
            order = list(range(len(epoch_batches)))
            random.Random(opts.seed * 1000 + epoch).shuffle(order)
            state["order"], state["order_epoch"] = order, epoch
        batch = _batch(examples, epoch_batches[state["order"][within]], opts)
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(state["step"])
        loss, kl, accs, rows = _ttt(module, batch, opts, draft_lm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        state["step"] += 1
        state["seconds"] += time.perf_counter() - t0
        state["tokens"] += rows
        loss_value = float(loss.detach())
        for key, value in [("loss", loss_value), ("kl", kl)] + [(f"acc{i}", a) for i, a in enumerate(accs)]:
            smooth[key] = value if key not in smooth else 0.95 * smooth[key] + 0.05 * value
        est = estimated_accept_length([smooth[f"acc{i}"] for i in range(len(accs))])
        record = {"step": state["step"], "epoch": state["step"] / len(epoch_batches), "lr": lr_at(state["step"] - 1),
                  "loss": loss_value, "kl": kl, "acc": accs, "est_accept": est, "seconds": state["seconds"], "tokens": state["tokens"]}
        if val_examples and (state["step"] % opts.val_every == 0 or state["step"] == total_steps):
            record.update(_held_out(module, val_examples, opts, draft_lm))
            state["val"] = record["val_acc"]
        logf.write(json.dumps(record) + "\n")
        logf.flush()  # a stopped run keeps its log up to its last step
        val = "/".join(f"{a:.2f}" for a in state.get("val", []))
        bar.set_postfix(loss=f"{smooth['loss']:.3f}", kl=f"{smooth['kl']:.3f}", acc="/".join(f"{smooth[f'acc{i}']:.2f}" for i in range(len(accs))),
                        est_len=f"{est:.2f}", **({"held_out": val} if val else {}))
        bar.update(1)
        if time.perf_counter() - last_save > 60 * opts.checkpoint_minutes:
            save()
            last_save = time.perf_counter()
        if opts.minutes is not None and time.perf_counter() - stretch_start > 60 * opts.minutes:
            log(f"\nstopping this stretch after {opts.minutes} min at step {state['step']}/{total_steps}; run again to resume")
            break
    save()
    bar.close()
    logf.close()
    if val_examples and "val_acc" not in record:  # a resumed finished run, or a stretch that stopped early
        record.update(_held_out(module, val_examples, opts, draft_lm))
    return {**record, "total_steps": total_steps, "done": state["step"] >= total_steps}
