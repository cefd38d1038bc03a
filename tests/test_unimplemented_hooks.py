"""Hooks designed in but not implemented yet fail loudly, naming the issue that will add them."""

import pytest
from verispec.proposers.base import Draft


def test_tree_drafts_fail_loudly():
    assert Draft(tokens=[1, 2]).parents is None  # a chain
    with pytest.raises(NotImplementedError, match="issue 15"):
        Draft(tokens=[1, 2, 3], parents=[-1, 0, 0])

