"""EAGLE heads: the target's states through the runner, heads in the published format, drafting
losslessly, and `verispec train-draft` end to end on a tiny model."""

import json
import subprocess
import sys

import pytest
import torch
from tiny_models import write_eagle3_head

from verispec.proposers.base import Budget
from verispec.runners.base import RunnerCapabilities
from verispec import LLM, SamplingParams
from verispec.errors import IncompatibleDraftError
from verispec.models.heads.eagle_io import load_head

LAYERS = 6  # default fused layers (2, L // 2, L - 3) = (2, 3, 3)


def prompts(n=8, seed=0, vocab=96):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, vocab, (int(torch.randint(4, 14, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def test_aux_states_are_the_residual_streams_entering_the_layers(tiny_dir):
    """Fused states = HF's hidden_states[i] (the stream entering layer i), short rows and prompts alike."""
    import transformers as tf

    folder = tiny_dir("llama", seed=0, layers=LAYERS)
    hf = tf.AutoModelForCausalLM.from_pretrained(folder).float().eval()
    runner = LLM(str(folder)).runner
    for n in (9, 60):  # the row-wise kernels' path, then the prompt path
        ids = prompts(1, seed=n)[0] * (n // 5 + 1)
        ids = ids[:n]
        with torch.no_grad():
            ref = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        seq = runner.open(n)
        out = runner.forward(seq, ids, num_logits=1, aux_layers=(2, 3, 5))
        runner.close(seq)
        expected = torch.cat([ref[2][0], ref[3][0], ref[5][0]], -1)
        assert out.aux.shape == (n, 3 * 64)
        torch.testing.assert_close(out.aux, expected, atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {
        "published": write_eagle3_head(root / "published", seed=1),
        "vllm": write_eagle3_head(root / "vllm", seed=1, vllm_names=True),
        "gemma3": write_eagle3_head(root / "gemma3", seed=2, aux_layers=[0, 1, 2], heads=2, kv_heads=1),
    }


def test_vllm_names_load_as_published(heads):
    a = load_head(heads["published"], 64, 96)[1]
    b = load_head(heads["vllm"], 64, 96)[1]
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind,head", [("llama", "published"), ("llama", "vllm"), ("gemma3", "gemma3")])
@pytest.mark.parametrize("k", (1, 4))
def test_greedy_identical_with_a_published_head(tiny_dir, heads, kind, head, k):
    target = tiny_dir(kind, seed=0, layers=LAYERS if kind == "llama" else 2)
    ps = prompts()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in LLM(str(target)).generate(ps, params)]
    spec = {"method": "eagle3", "draft_model": str(heads[head]), "num_speculative_tokens": k, "adaptive_k": False}
    outs = LLM(str(target), speculative=spec).generate(ps, params)
    assert [o.token_ids for o in outs] == ref
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


@pytest.mark.parametrize("kind,head", [("llama", "published"), ("gemma3", "gemma3")])
def test_eagle3_trees_keep_greedy_output(tiny_dir, heads, kind, head):
    """tree_max_nodes with eagle3: the head's chain and each level's runner-up, verified as a tree,
    sized by the head's own probabilities; greedy output identical to plain decoding. With
    adaptive_k off every node is verified, so the trees really run."""
    target = tiny_dir(kind, seed=0, layers=LAYERS if kind == "llama" else 2)
    ps = prompts()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in LLM(str(target)).generate(ps, params)]
    spec = {"method": "eagle3", "draft_model": str(heads[head]), "num_speculative_tokens": 3, "tree_max_nodes": 6,
            "adaptive_k": False}
    outs = LLM(str(target), speculative=spec).generate(ps, params)
    assert [o.token_ids for o in outs] == ref
    assert sum(o.metrics.num_draft_tokens for o in outs) >= 6 * len(ps)  # whole trees verified, not chains of 1


def test_eagle3_tree_is_best_first_with_path_probabilities(tiny_dir, heads):
    """propose_tree's nodes: best first, every parent before its children, each node's probability
    its parent's times the head's own probability of it (a main chain and one runner-up per level)."""
    from verispec.proposers.base import SequenceView
    from verispec.proposers.eagle import EXPAND_MIN

    llm = LLM(str(tiny_dir("llama", seed=0, layers=LAYERS)), speculative={"method": "eagle3", "draft_model": str(heads["published"])})
    proposer, runner = llm.decoder.proposer, llm.runner
    ids = prompts(1, seed=5)[0]
    seq = runner.open(64)
    out = runner.forward(seq, ids, num_logits=1, aux_layers=proposer.target_states)
    view = SequenceView(request_id=7, tokens=ids + [int(out.logits[-1].argmax())], num_prompt_tokens=len(ids),
                        params=SamplingParams(temperature=0.0), generator=None, capacity=64)
    view.states.append(out.aux)
    proposer.begin(view)
    tree = proposer.propose(view, Budget(3, 16, lambda kind: 3))
    runner.close(seq)
    levels = len(tree) // 2  # each level: the main chain's node and its runner-up
    assert 1 <= levels <= 3 and len(tree) == 2 * levels and tree.probs is None
    assert tree.node_probs == sorted(tree.node_probs, reverse=True)
    assert all(p < i for i, p in enumerate(tree.parents))
    main = tree.main_path()
    chain = [tree.node_probs[i] for i in range(len(tree)) if main[i]]
    assert len(chain) == levels and tree.parents[0] == -1 and tree.parents.count(-1) == 2
    for i, p in enumerate(tree.parents):
        assert tree.node_probs[i] <= (1.0 if p < 0 else tree.node_probs[p]) + 1e-7
    # the chain grew while its path was likely enough, and stopped where it was not (or at the depth asked)
    assert all(q >= EXPAND_MIN for q in chain[:-1]) and (levels == 3 or chain[-1] < EXPAND_MIN)


def test_kernel_products_give_the_heads_float32_products(tiny_dir, heads, tmp_path):
    """A drafting step through the row-wise kernels (q/k/v and gate/up fused, weights as stored)
    gives the logits torch's float32 products give; a float16 or bfloat16 checkpoint is multiplied
    in those bytes (half the memory read: the same values), a float32 one in float32."""
    from verispec.models.kernels import rowwise
    from verispec.models.heads.eagle import EagleHead

    if rowwise.kernel() is None:
        pytest.skip("no row-wise kernel on this machine")
    single = write_eagle3_head(tmp_path / "f32", seed=3, dtype=torch.float32)
    brain = write_eagle3_head(tmp_path / "bf16", seed=3, dtype=torch.bfloat16)
    # bfloat16 values that float16 also holds exactly go as float16: the same values either way
    for folder, codes in ((single, {0}), (heads["published"], {1}), (brain, {1, 30})):
        config, weights = load_head(folder, 64, 96)
        head = EagleHead(config, weights, lambda t: torch.nn.functional.embedding(t, torch.randn(96, 64, generator=torch.Generator().manual_seed(0))))
        types = head.products["qkv"][0][1] + head.products["lm_head"][0][1]
        assert len(types) == 4 and set(types) <= codes
        g = torch.Generator().manual_seed(4)
        states, tokens = torch.randn(12, config.state_width, generator=g), torch.randint(3, 96, (12,), generator=g)
        runs = []
        for products in (head.products, {}):
            head.products = products
            cache = head.new_cache(16)
            head.forward(states[:9], tokens[:9], cache, fused=True)  # a short prompt: kernel rows too
            logits, pre = head.forward(states[9:10], tokens[9:10], cache, fused=True)
            step, _ = head.forward(pre, tokens[10:11], cache, fused=False)
            runs.append(torch.cat([logits, step]))
        torch.testing.assert_close(runs[0], runs[1], atol=2e-5, rtol=1e-5)


def test_first_draft_is_the_head_over_the_targets_states(tiny_dir, heads):
    """The drafter pairs each target state with the next token (state p, token p + 1): its first
    draft equals the head run by hand over a fresh forward's states."""
    from verispec.models.heads.eagle import EagleHead

    target = tiny_dir("llama", seed=0, layers=LAYERS)
    llm = LLM(str(target), speculative={"method": "eagle3", "draft_model": str(heads["published"]),
                                        "num_speculative_tokens": 3, "adaptive_k": False})
    dec = llm.decoder
    prompt = prompts(1, seed=5)[0]
    req = dec.start(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    for _ in range(2):  # a verification step in between, so later states arrive through verify
        dec.step(req)
    tokens = list(req.view.tokens)
    draft = dec.proposer.propose(req.view, Budget.chain(3))
    dec.finish(req)

    runner = llm.runner
    seq = runner.open(len(tokens))
    states = runner.forward(seq, tokens[:-1], num_logits=1, aux_layers=(2, 3, 3)).aux  # [n - 1, 192]
    runner.close(seq)
    cfg, w = load_head(heads["published"], 64, 96)
    head = EagleHead(cfg, w, runner.embed)
    cache = head.new_cache(len(tokens) + 4)
    logits, pre = head.forward(states, torch.tensor(tokens[1:]), cache, fused=True)
    first = int(head.to_target(logits[-1].argmax()))
    second = int(head.to_target(head.forward(pre[-1:], torch.tensor([first]), cache, fused=False)[0][-1].argmax()))
    assert draft.tokens[:2] == [first, second]


def test_prefix_caching_and_chunked_prefill_keep_output(tiny_dir, heads):
    """A prefix-cached prompt has no target states for its cached part: the head starts after it."""
    target = tiny_dir("llama", seed=0, layers=LAYERS)
    base = prompts(1, seed=9)[0] * 6  # > one 16-token block
    ps = [base + [5, 6], base + [7, 8, 9]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ref = [o.token_ids for o in LLM(str(target)).generate(ps, params)]
    spec = {"method": "eagle3", "draft_model": str(heads["published"]), "num_speculative_tokens": 3, "adaptive_k": False}
    llm = LLM(str(target), speculative=spec, enable_prefix_caching=True, enable_chunked_prefill=True)
    outs = [llm.generate([p], params)[0] for p in ps]  # the second reuses the first's blocks
    assert [o.token_ids for o in outs] == ref
    assert outs[1].metrics.num_cached_prompt_tokens > 0


def test_mismatched_heads_and_backends_are_refused(tiny_dir, heads, tmp_path):
    target = str(tiny_dir("llama", seed=0, layers=LAYERS))
    wide = write_eagle3_head(tmp_path / "wide", hidden=32, heads=2, kv_heads=1)
    with pytest.raises(IncompatibleDraftError, match="width"):
        LLM(target, speculative={"method": "eagle3", "draft_model": str(wide)})
    other_vocab = write_eagle3_head(tmp_path / "vocab", target_vocab=120)
    with pytest.raises(IncompatibleDraftError, match="vocabulary"):
        LLM(target, speculative={"method": "eagle3", "draft_model": str(other_vocab)})
    from verispec.config import SpeculativeConfig
    from verispec.proposers.eagle import EagleProposer

    class NoStates:  # a backend that returns logits only (llama.cpp's)
        backend = "llamacpp"
        capabilities = RunnerCapabilities()

    with pytest.raises(IncompatibleDraftError, match="backend torch"):
        EagleProposer.create(SpeculativeConfig(method="eagle3", draft_model=str(heads["published"])), NoStates())


def chats(path, n=40):
    """Conversations with a learnable shape: counting, repeated phrases."""
    lines = []
    for i in range(n):
        q = f"count from {i % 7} please"
        a = " ".join(str((i + j) % 10) for j in range(30))
        lines.append(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_draft_end_to_end(tiny_dir, tmp_path):
    """Features, vocabulary, training (loss falls), export in the published format, resume, and
    the trained head drafts losslessly with better acceptance than an untrained one."""
    target = tiny_dir("llama", seed=0, vocab=320, layers=LAYERS, tokenizer="bytes")
    data = chats(tmp_path / "chats.jsonl")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "verispec.cli", "train-draft", "--model", str(target), "--data", str(data),
           "--out", str(out), "--tokens", "6000", "--max-answer", "40", "--draft-vocab", "128", "--epochs", "60",
           "--batch-tokens", "1024", "--warmup", "5", "--lr", "3e-3", "--eval-prompts", "0", "--feature-dtype", "float32",
           "--export", str(tmp_path / "exported")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    head_kl = sum(r["kl"] for r in log[:5]) / 5  # the loss above the target's entropy, its floor
    tail_kl = sum(r["kl"] for r in log[-5:]) / 5
    assert tail_kl < 0.7 * head_kl, (head_kl, tail_kl)
    cfg = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 128
    assert cfg["verispec_recipe"]["finished"] is True
    assert (out / "loss.png").stat().st_size > 0
    # resume: more epochs continue from the checkpoint instead of starting over
    again = subprocess.run(cmd[:cmd.index("--epochs") + 1] + ["64"] + cmd[cmd.index("--epochs") + 2:],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed at step" in again.stdout + again.stderr
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > len(log)

    llm_plain = LLM(str(target))
    ps = [llm_plain.tokenizer.encode_chat([{"role": "user", "content": f"count from {i} please"}]) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in llm_plain.generate(ps, params)]

    def acceptance(head):
        llm = LLM(str(target), speculative={"method": "eagle3", "draft_model": str(head), "num_speculative_tokens": 3,
                                            "adaptive_k": False})
        outs = llm.generate(ps, params)
        assert [o.token_ids for o in outs] == ref
        return sum(o.metrics.num_accepted_tokens for o in outs) / sum(o.metrics.num_draft_tokens for o in outs)

    untrained = write_eagle3_head(tmp_path / "untrained", hidden=64, target_vocab=320, draft_vocab=128)
    trained, random_head = acceptance(out / "head"), acceptance(untrained)
    assert trained > random_head + 0.1, (trained, random_head)

    # --init-head: a new run starts from the trained head, its weights and its draft vocabulary
    def fresh_run(name, *extra):
        run = subprocess.run([sys.executable, "-m", "verispec.cli", "train-draft", "--model", str(target), "--data", str(data),
                              "--out", str(tmp_path / name), "--tokens", "6000", "--max-answer", "40", "--draft-vocab", "128",
                              "--epochs", "2", "--batch-tokens", "1024", "--warmup", "5", "--lr", "3e-3", "--eval-prompts", "0",
                              "--feature-dtype", "float32", *extra], capture_output=True, text=True, timeout=600)
        return run, [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()] if run.returncode == 0 else []

    started, started_log = fresh_run("from-head", "--init-head", str(out / "head"))
    assert started.returncode == 0, started.stderr[-2000:]
    assert torch.equal(torch.load(tmp_path / "from-head" / "vocab.pt")["d2t"], torch.load(out / "vocab.pt")["d2t"])
    assert started_log[0]["kl"] < 0.7 * head_kl, (started_log[0]["kl"], head_kl)  # not from scratch
    other = write_eagle3_head(tmp_path / "narrow", hidden=32, target_vocab=320, draft_vocab=128)
    refused, _ = fresh_run("from-narrow", "--init-head", str(other))
    assert refused.returncode != 0 and "--init-head" in refused.stderr


def test_sharegpt_held_out_records_are_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "verispec.cli", "train-draft", "--records", "0:15000", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "held out" in r.stderr


def _tiny_head_config(draft_vocab: int):
    """A 16-wide EAGLE-3 head over a 40-token target vocabulary: the training tests' shape."""
    from verispec.models.config import RopeConfig
    from verispec.models.heads.eagle import HeadConfig

    return HeadConfig(kind="eagle3", hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32,
                      rms_eps=1e-6, rope=RopeConfig(10000.0), vocab_size=40, draft_vocab_size=draft_vocab, target_hidden_size=16)


def test_head_starts_from_the_targets_lm_head_and_norm():
    """init_from_target: the head's LM head and final norm are copies of the tensors given (the
    target's draft-vocabulary rows and final norm), the rest random; a wrong shape is refused."""
    from verispec.train.trainer import HeadModule

    config = _tiny_head_config(draft_vocab=8)
    d2t, t2d = torch.zeros(8, dtype=torch.long), torch.zeros(40, dtype=torch.bool)
    lm, norm = torch.randn(8, 16), torch.rand(16) + 0.5
    embed = torch.randn(40, 16)
    head = HeadModule(config, embed, d2t, t2d, seed=0, init={"lm_head.weight": lm, "norm.weight": norm})
    assert torch.equal(head.w["lm_head.weight"], lm) and torch.equal(head.w["norm.weight"], norm)
    lm[0, 0] += 1  # a copy, not the caller's tensor
    assert not torch.equal(head.w["lm_head.weight"], lm)
    plain = HeadModule(config, embed, d2t, t2d, seed=0)
    assert torch.equal(plain.w["norm.weight"], torch.ones(16)) and not torch.equal(plain.w["lm_head.weight"], head.w["lm_head.weight"])
    assert torch.equal(plain.w["fc.weight"], head.w["fc.weight"])  # the same seed: only the given tensors differ
    with pytest.raises(ValueError, match="shape"):
        HeadModule(config, embed, d2t, t2d, seed=0, init={"lm_head.weight": torch.zeros(9, 16)})


def _tiny_examples(config, n, seed):
    """Feature dicts shaped as train/features.py writes them, with random contents."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        T, a0 = 24, 6
        tokens = torch.randint(0, config.vocab_size, (T,), generator=g, dtype=torch.int32)
        out.append({"tokens": tokens, "answer_start": a0,
                    "aux": torch.randn(T, config.state_width, generator=g).half(),
                    "hidden": torch.randn(T, config.hidden_size, generator=g).half(),
                    "argmax": torch.randint(0, config.vocab_size, (T - a0 + 1,), generator=g, dtype=torch.int32)})
    return out


def test_states_past_float16s_range_are_stored_in_bfloat16_and_train_finitely():
    """Gemma 3's residual streams reach 6e4 and more: stored in float16 they were inf and the
    training loss NaN. Features fit for float16 stay float16 (its finer mantissa), others are
    bfloat16; a batch mixing both collates to finite values and a finite loss."""
    from verispec.train.features import narrow
    from verispec.train.trainer import HeadModule, TrainOptions, collate, ttt_loss

    small = torch.randn(5, 6) * 100
    assert narrow(small).dtype == torch.float16 and torch.equal(narrow(small), small.half())
    big = small.clone()
    big[2, 3] = 2e5  # float16's largest is 65504
    assert narrow(big).dtype == torch.bfloat16 and torch.isfinite(narrow(big)).all()
    assert float(narrow(big)[2, 3]) == pytest.approx(2e5, rel=1e-2)

    config = _tiny_head_config(draft_vocab=40)
    examples = _tiny_examples(config, 4, 3)
    for ex in examples[2:]:  # as a Gemma 3 target's: large states, stored as narrow() stores them
        ex["aux"] = narrow(ex["aux"].float() * 1e5)
        ex["hidden"] = narrow(ex["hidden"].float() * 1e5)
    assert examples[0]["hidden"].dtype == torch.float16 and examples[2]["hidden"].dtype == torch.bfloat16
    batch = collate(examples, [0, 2, 1, 3], max_len=64, dtype=torch.bfloat16)
    assert torch.isfinite(batch["aux"]).all() and torch.isfinite(batch["hidden"]).all()
    assert batch["hidden"].abs().max() > 1e5  # not clipped to the first example's float16
    head = HeadModule(config, torch.randn(40, 16), torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.bool), seed=0)
    opts = TrainOptions(draft_vocab=40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, kl, accs, rows = ttt_loss(head, batch, opts.ttt_steps, opts.step_weight, torch.randn(40, 16))
    assert torch.isfinite(loss) and rows > 0


def test_training_can_freeze_the_lm_head_and_logs_held_out_accuracy(tmp_path):
    """train_lm_head=False: the LM head and final norm stay the target's while the rest learns;
    held-out accuracy is logged every val_every steps and at the end, and equals validate()'s."""
    from verispec.train.trainer import HeadModule, TrainOptions, train, validate

    config = _tiny_head_config(draft_vocab=40)
    d2t, t2d = torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.bool)
    lm, norm = torch.randn(40, 16), torch.rand(16) + 0.5
    head = HeadModule(config, torch.randn(40, 16), d2t, t2d, seed=0, init={"lm_head.weight": lm, "norm.weight": norm})
    fc = head.w["fc.weight"].detach().clone()
    opts = TrainOptions(draft_vocab=40, batch_tokens=96, epochs=2, warmup=1, lr=1e-2, val_every=3, bf16=False,
                        train_lm_head=False)
    train_ex, val_ex = _tiny_examples(config, 12, 1), _tiny_examples(config, 4, 2)
    last = train(head, train_ex, opts, tmp_path, lm, val_ex, log=lambda *a: None)
    assert torch.equal(head.w["lm_head.weight"], lm) and torch.equal(head.w["norm.weight"], norm)
    assert not torch.equal(head.w["fc.weight"], fc)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    checked = [r["step"] for r in rows if "val_acc" in r]
    assert checked == [s for s in range(1, len(rows) + 1) if s % 3 == 0 or s == len(rows)] and len(checked) >= 2
    assert last["val_acc"] == pytest.approx(validate(head, val_ex, opts, lm))
    assert all(0.0 <= a <= 1.0 for a in last["val_acc"])
    # resuming with the other setting would mismatch the optimizer's state: refused, saying why
    from dataclasses import replace

    from verispec.errors import ConfigError

    with pytest.raises(ConfigError, match="no-train-lm-head"):
        train(head, train_ex, replace(opts, train_lm_head=True), tmp_path, lm, val_ex, log=lambda *a: None)


def test_feature_stage_stops_after_its_minutes_and_resumes(tiny_dir, tmp_path):
    """FeatureOptions.minutes ends a stretch after the batch in hand (its conversations stored,
    none lost); the next stretch carries on from the next record."""
    from verispec.train.features import FeatureOptions, Manifest, build_features, load_shards

    target = tiny_dir("llama", seed=0, vocab=320, layers=LAYERS, tokenizer="bytes")
    data = chats(tmp_path / "chats.jsonl", n=40)
    llm = LLM(str(target), batch_invariant=False)
    opts = FeatureOptions(data=str(data), stop=None, max_answer=8, tokens=10**6, batch=4, minutes=0.0)
    first = build_features(llm, opts, tmp_path / "f", (0, 1, 2), log=lambda *a: None)
    assert first.examples == 4 and first.next_record == 4 and len(first.shards) == 1
    second = build_features(llm, opts, tmp_path / "f", (0, 1, 2), log=lambda *a: None)
    assert second.examples == 8 and second.next_record == 8 and len(second.shards) == 2
    examples = load_shards(tmp_path / "f")
    assert len(examples) == 8 and Manifest.load(tmp_path / "f").tokens == sum(len(e["tokens"]) for e in examples)


def test_eagle3_is_ready_only_where_a_head_is_bundled(tiny_dir):
    """What the demo offers with nothing beside the model: no bundled head for a random target, so
    eagle3 (and draft_model, which needs a model) are left out; the copy drafters are in."""
    from verispec.engine.assembly import ready_methods

    ready = ready_methods(LLM(str(tiny_dir("llama", seed=0))).runner)
    assert {"prompt_lookup", "suffix"} <= set(ready)
    assert not {"eagle3", "draft_model", "hybrid"} & set(ready)
