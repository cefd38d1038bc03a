"""Token trees in one forward (issue 15): each node of a draft tree attends to the cache and its
own path only, at its depth's position, so its logits are bit for bit those of decoding its path
alone; KVCache.keep then keeps one path, after which decoding goes on as if only that path had
been forwarded. Checked on every kernel variant and MKL's products, with and without batch
invariance (without it, to float tolerance: another arithmetic, the same attention)."""

import pytest
import torch

from verispec import LLM
from verispec.runners.base import BatchItem
from verispec.models.decoder.kv_cache import KVCache
from verispec.models.decoder.transformer import tree_paths

# a tree of 9 rows below the cache: row 0 is the pending token (the root), then branches
#   0 ─ 1 ─ 3 ─ 6
#   │   └ 4
#   └ 2 ─ 5 ─ 7 ─ 8
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 5, 7]
# 11 deep with a branch at depth 5: past gemma3's window of 8, a deep row's window starts inside the tree
DEEP = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 11, 12]


def path_logits(runner, prompt, tokens, path):
    """Logits of the path's last token, decoding prompt + the path's tokens one at a time."""
    seq = runner.open(len(prompt) + len(path))
    runner.forward(seq, prompt)
    for t in path:
        out = runner.forward(seq, [tokens[t]]).logits
    runner.close(seq)
    return out[0]


def test_tree_paths():
    assert tree_paths(PARENTS)[8] == [0, 2, 5, 7, 8] and tree_paths(PARENTS)[4] == [0, 1, 4]
    with pytest.raises(ValueError, match="earlier row"):
        tree_paths([-1, 1])


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_node_gets_its_paths_logits(tiny_dir, family, products):
    runner = LLM(str(tiny_dir(family, seed=1))).runner
    g = torch.Generator().manual_seed(5)
    for ctx in (3, 12):  # gemma3's window is 8: the deep nodes' windows start past the prompt's first keys
        check_tree(runner, DEEP, torch.randint(3, 96, (ctx,), generator=g).tolist(), g)
        prompt = torch.randint(3, 96, (ctx,), generator=g).tolist()
        tokens = torch.randint(3, 96, (len(PARENTS),), generator=g).tolist()
        seq = runner.open(ctx + len(PARENTS) + 1)
        runner.forward(seq, prompt)
        beside = runner.open(8)  # another request in the same forward
        out = runner.forward_batch([BatchItem(beside, [5, 6, 7], num_logits=3),
                                    BatchItem(seq, tokens, num_logits=len(tokens), parents=PARENTS)])[1].logits
        for t, path in enumerate(tree_paths(PARENTS)):
            alone = path_logits(runner, prompt, tokens, path)
            assert torch.equal(out[t], alone), f"{family}, context {ctx}, node {t}: max diff {(out[t] - alone).abs().max():.3g}"
        # keep the path to node 7, then decode one more token: as if only that path had been forwarded
        runner.keep(seq, ctx, [0, 2, 5, 7])
        assert runner.length(seq) == ctx + 4
        after = runner.forward(seq, [tokens[8]]).logits[0]
        assert torch.equal(after, path_logits(runner, prompt, tokens, [0, 2, 5, 7, 8]))
        runner.close(seq)
        runner.close(beside)


def check_tree(runner, parents, prompt, g):
    """Every node of a tree after `prompt` against its path decoded alone, bit for bit."""
    tokens = torch.randint(3, 96, (len(parents),), generator=g).tolist()
    seq = runner.open(len(prompt) + len(parents))
    runner.forward(seq, prompt)
    out = runner.forward(seq, tokens, num_logits=len(tokens), parents=parents).logits
    runner.close(seq)
    for t, path in enumerate(tree_paths(parents)):
        alone = path_logits(runner, prompt, tokens, path)
        assert torch.equal(out[t], alone), f"node {t} (depth {len(path) - 1}): max diff {(out[t] - alone).abs().max():.3g}"


def test_without_batch_invariance_the_masks_hold(tiny_dir):
    runner = LLM(str(tiny_dir("gemma3", seed=1)), batch_invariant=False).runner
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(3, 96, (12,), generator=g).tolist()
    tokens = torch.randint(3, 96, (len(PARENTS),), generator=g).tolist()
    for parents in (PARENTS, DEEP):
        seq = runner.open(30)
        runner.forward(seq, prompt)
        out = runner.forward(seq, tokens[: len(parents)] + [5] * (len(parents) - len(tokens)), num_logits=len(parents),
                             parents=parents).logits
        runner.close(seq)
        for t, path in enumerate(tree_paths(parents)):
            path_tokens = tokens + [5] * (len(parents) - len(tokens))
            torch.testing.assert_close(out[t], path_logits(runner, prompt, path_tokens, path), atol=1e-4, rtol=1e-4)


def test_the_check_fails_when_siblings_see_each_other(tiny_dir):
    """Negative control: forwarding the same rows as a chain (each row seeing every row before it)
    gives nodes off the first branch other logits, which the comparison above catches."""
    runner = LLM(str(tiny_dir("llama", seed=1))).runner
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 96, (6,), generator=g).tolist()
    tokens = torch.randint(3, 96, (len(PARENTS),), generator=g).tolist()
    seq = runner.open(20)
    runner.forward(seq, prompt)
    chain = runner.forward(seq, tokens, num_logits=len(tokens)).logits
    assert not torch.equal(chain[2], path_logits(runner, prompt, tokens, tree_paths(PARENTS)[2]))


def test_keep_after_the_cache_grew_in_a_forward(tiny_dir):
    """The cache's buffers double inside a forward (inference mode) past KVCache.INITIAL
    positions; keeping a path in them afterwards still works, and decodes as the path alone."""
    runner = LLM(str(tiny_dir("llama", seed=1))).runner
    prompt = [3 + i % 90 for i in range(KVCache.INITIAL + 20)]
    tokens = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    seq = runner.open(len(prompt) + len(tokens) + 1)
    runner.forward(seq, prompt)
    runner.forward(seq, tokens, num_logits=len(tokens), parents=PARENTS)
    runner.keep(seq, len(prompt), [0, 2, 5])
    after = runner.forward(seq, [tokens[7]]).logits[0]
    assert torch.equal(after, path_logits(runner, prompt, tokens, [0, 2, 5, 7]))


def test_keep_moves_a_path_together():
    cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=1, capacity=16)
    cache.keys[0, 0, :8, 0] = torch.arange(8.0)
    cache.values[0, 0, :8, 0] = -torch.arange(8.0)
    cache.advance(8)
    cache.keep(3, [0, 2, 4])  # slots 3, 5, 7 -> 3, 4, 5
    assert cache.length == 6
    assert cache.keys[0, 0, :6, 0].tolist() == [0, 1, 2, 3, 5, 7]
    assert cache.values[0, 0, :6, 0].tolist() == [0, -1, -2, -3, -5, -7]
    cache.keep(6, [])  # nothing kept below the root: the cache just ends there
    assert cache.length == 6
    for start, indices in [(3, [2, 1]), (3, [0, 3]), (7, [0])]:  # not increasing; beyond the cache
        with pytest.raises(ValueError, match="cannot keep"):
            cache.keep(start, indices)
