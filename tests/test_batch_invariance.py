"""The torch backend's batch invariance: a row's logits do not depend on what it is computed with.

With batch_invariant on (the default), a token verified inside a draft, or decoded beside other
requests in one batch, gets bit for bit the logits a one-token decode gives it: torch.equal, no
tolerance. That is what makes greedy speculative output token-identical to plain decoding by
construction rather than by luck of float rounding.
"""

import pytest
import torch

from verispec import LLM
from verispec.runners.torch_runner import invariant_cost, kernel_cost
from verispec.runners.base import BatchItem
from verispec.models.kernels import rowwise
from verispec.models.decoder.transformer import Segment, Transformer, invariant_chunks, probe_invariant_width


def test_invariant_chunks():
    assert [invariant_chunks(n) for n in range(10)] == [
        [], [1], [2], [3], [2, 2], [3, 2], [3, 3], [3, 2, 2], [3, 3, 2], [3, 3, 3]
    ]
    for n in range(1, 70):
        sizes = invariant_chunks(n)
        assert sum(sizes) == n and all(1 <= s <= 3 for s in sizes)
    assert [invariant_chunks(n, 8) for n in (1, 8, 11, 16)] == [[1], [8], [8, 3], [8, 8]]  # the kernel's passes


def test_row_groups_chunk_decoding_rows_and_keep_prompts_whole():
    def seg(T, num_logits):
        return Segment(torch.zeros(T, dtype=torch.int64), None, num_logits)

    groups = Transformer._row_groups([seg(1, 1), seg(1, 1), seg(1, 1), seg(60, 1), seg(5, 5), seg(2, 2)])
    assert groups == [3, 60, 3, 2, 2]  # decoding rows of neighbouring requests share products


def decode_alone(runner, prompt, new):
    """Logits of each token of `new` decoded one at a time after `prompt`: [len(new), vocab]."""
    seq = runner.open(len(prompt) + len(new))
    runner.forward(seq, prompt)
    rows = torch.cat([runner.forward(seq, [t]).logits for t in new])
    runner.close(seq)
    return rows


def check_rows_invariant(runner, contexts, seed=0, vocab=None):
    """Verification blocks of 2..12 rows, and a ragged batch beside a prompt and another decoding
    row, against one-token decodes: every row bit-identical."""
    g = torch.Generator().manual_seed(seed)
    high = min(vocab or runner.vocab_size, 30000)
    for ctx in contexts:
        prompt = torch.randint(3, high, (ctx,), generator=g).tolist()
        new = torch.randint(3, high, (12,), generator=g).tolist()
        alone = decode_alone(runner, prompt, new)
        seq = runner.open(ctx + 12)
        runner.forward(seq, prompt)
        for T in (2, 3, 4, 5, 9, 12):
            together = runner.forward(seq, new[:T], num_logits=T).logits
            for r in range(T):
                assert torch.equal(together[r], alone[r]), f"context {ctx}, row {r} of {T}: " \
                    f"max diff {(together[r] - alone[r]).abs().max().item():.3g}"
            runner.truncate(seq, ctx)
        other, second = runner.open(64), runner.open(ctx + 1)
        runner.forward(second, prompt)
        outs = runner.forward_batch([BatchItem(other, prompt[:50]), BatchItem(second, new[:1]), BatchItem(seq, new[:5], num_logits=5)])
        assert torch.equal(outs[1].logits, alone[:1]) and torch.equal(outs[2].logits, alone[:5])
        for s in (seq, other, second):
            runner.close(s)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_models_rows_bit_identical(tiny_dir, family, products):
    runner = LLM(str(tiny_dir(family, seed=0))).runner
    assert runner.batch_invariant  # the default
    assert runner.model.uses_kernel == (products != "mkl")
    # the kernel: 8 rows a pass by construction; MKL: what the load-time probe found on this CPU
    assert runner.model.invariant_width == 8 if products != "mkl" else 1 <= runner.model.invariant_width <= 3
    check_rows_invariant(runner, contexts=(1, 6, 13, 40), vocab=96)  # gemma3: past its window of 8


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_bundled_models_rows_bit_identical(name):
    runner = LLM(name).runner
    check_rows_invariant(runner, contexts=(37, 300, 530))  # Gemma: past its 512-token window


def test_the_check_fails_when_rows_round_with_their_neighbours(tiny_dir, monkeypatch):
    """The control that shows the check above can fail: batch invariance off, MKL's path, and
    products of several rows accumulated in float64 (a stand-in for a BLAS whose multi-row kernel
    rounds otherwise; whether MKL itself does depends on the CPU), so a verified row's logits
    differ from its one-row decode by construction."""
    import verispec.models.decoder.transformer as tr

    monkeypatch.setitem(rowwise._state, "module", None)
    real = tr.project

    def other_rounding(x, w, bias=None):
        if x.dim() == 2 and x.shape[0] > 1:
            y = (x.double() @ w.double().T).float()
            return y + bias if bias is not None else y
        return real(x, w, bias)

    monkeypatch.setattr(tr, "project", other_rounding)
    monkeypatch.setattr(tr.F, "linear", lambda x, w, b=None: other_rounding(x.reshape(-1, x.shape[-1]), w, b).reshape(*x.shape[:-1], -1))
    runner = LLM(str(tiny_dir("llama", seed=0)), batch_invariant=False).runner
    g = torch.Generator().manual_seed(0)
    prompt, new = torch.randint(3, 96, (20,), generator=g).tolist(), torch.randint(3, 96, (5,), generator=g).tolist()
    alone = decode_alone(runner, prompt, new)
    seq = runner.open(25)
    runner.forward(seq, prompt)
    together = runner.forward(seq, new, num_logits=5).logits
    assert not torch.equal(together, alone)
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)  # the same numbers, rounded otherwise


def test_cost_curve_follows_the_mode(tiny_dir, products):
    path = str(tiny_dir("llama", seed=0))
    mkl_width = LLM(path).runner.model.invariant_width if products == "mkl" else None
    expected = kernel_cost if products != "mkl" else invariant_cost if mkl_width == 3 else None
    if expected is not None:
        assert LLM(path).runner.builtin_cost() is expected
    assert LLM(path, batch_invariant=False).runner.builtin_cost() not in (invariant_cost, kernel_cost)
    assert kernel_cost(1) == 1.0 and kernel_cost(9) - kernel_cost(8) > 2 * (kernel_cost(8) - kernel_cost(7))  # a 2nd pass over the weights
    assert invariant_cost(1) == 1.0 and invariant_cost(2) == pytest.approx(1.1)
    assert invariant_cost(5) == pytest.approx(1.55 + 1.1)  # products of 3 and 2 rows


def test_many_rows_on_more_threads_stay_bit_identical(fast_products):
    """A server step verifying 8 requests' drafts (40 rows) with 3 threads: torch then splits an
    elementwise op over the batch between threads mid-vector, where the scalar and vector exp/tanh
    may round apart (6 of these 40 rows differed before the activation ran per decoding row)."""
    runner = LLM("gemma3-270m").runner
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 30000, (20 + 7 * i,), generator=g).tolist() for i in range(8)]
    news = [torch.randint(3, 30000, (5,), generator=g).tolist() for _ in range(8)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        alone = [decode_alone(runner, p, n) for p, n in zip(prompts, news)]
        seqs = [runner.open(len(p) + 5) for p in prompts]
        for s, p in zip(seqs, prompts):
            runner.forward(s, p)
        outs = runner.forward_batch([BatchItem(s, n, num_logits=5) for s, n in zip(seqs, news)])
    finally:
        torch.set_num_threads(threads)
    for i, (out, a) in enumerate(zip(outs, alone)):
        assert torch.equal(out.logits, a), f"request {i}: max diff {(out.logits - a).abs().max().item():.3g}"


def test_probe_finds_the_invariant_width():
    import verispec.models.decoder.transformer as tr

    w = torch.randn(700, 96)
    width = probe_invariant_width([w])
    assert 1 <= width <= 3
    x = torch.randn(width, 96)  # products of that width really give each row its one-row bits
    assert torch.equal(tr.project(x, w), torch.cat([tr.project(x[r : r + 1], w) for r in range(width)]))
    assert probe_invariant_width([w], max_width=1) == 1
    assert [invariant_chunks(n, 2) for n in (1, 4, 5)] == [[1], [2, 2], [2, 2, 1]]
    assert invariant_chunks(3, 1) == [1, 1, 1]


def test_probe_narrows_when_wider_products_round_otherwise(monkeypatch):
    import verispec.models.decoder.transformer as tr

    real = tr.project

    def drifting(x, w, bias=None):  # a stand-in MKL whose 3-row products round otherwise
        y = real(x, w, bias)
        return y * (1 + 1e-6) if x.shape[0] == 3 else y

    monkeypatch.setattr(tr, "project", drifting)
    assert tr.probe_invariant_width([torch.randn(300, 64)]) == 2
