"""Hooks designed in but not implemented yet fail loudly, naming the issue that will add them."""

import pytest
import torch

from verispec.models.kv_cache import KVCache
from verispec.proposers.base import Draft


def test_tree_drafts_fail_loudly():
    assert Draft(tokens=[1, 2]).parents is None  # a chain
    with pytest.raises(NotImplementedError, match="issue 15"):
        Draft(tokens=[1, 2, 3], parents=[-1, 0, 0])


def test_keeping_a_tree_path_fails_loudly():
    cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=2, capacity=8)
    with pytest.raises(NotImplementedError, match="issue 15"):
        cache.keep(0, torch.tensor([0, 2]))
