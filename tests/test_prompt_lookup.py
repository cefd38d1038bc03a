import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from verispec.proposers.prompt_lookup import find_continuation


def full_search(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule searched over the whole list at once (the index's reference): the longest tail
    n-gram's earlier occurrences, the most recent with k tokens after it, else the earliest."""
    n_tokens = len(tokens)
    if n_tokens < min_n + 1 or k < 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, n_tokens - 1), min_n - 1, -1):
        tail = arr[n_tokens - n :]
        windows = sliding_window_view(arr[: n_tokens - 1], n)  # windows starting at 0..n_tokens-1-n
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            starts = hits + n  # where each match's continuation begins
            full = starts[starts + k <= n_tokens]
            start = int(full[-1]) if full.size else int(starts[0])
            return arr[start : start + k].tolist()
    return []


def test_longest_ngram_first():
    #        0  1  2  3  4  5  6  7  8
    tokens = [5, 1, 2, 3, 9, 7, 2, 3, 1, 2, 3]
    # tail "1 2 3" (n=3) occurred at 1..3 -> continuation 9 7 2 ...
    assert find_continuation(tokens, 3, 1, 3) == [9, 7, 2]
    # with max n = 2, tail "2 3": the most recent earlier match with k tokens after it is at 6..7
    assert find_continuation(tokens, 2, 1, 2) == [1, 2]


def test_no_match_and_short_inputs():
    assert find_continuation([1, 2, 3, 4], 4, 1, 3) == []
    assert find_continuation([1], 4, 1, 3) == []
    assert find_continuation([1, 2, 1, 2], 0, 1, 3) == []


def test_repeating_loop_prefers_a_full_continuation():
    tokens = [4, 5] * 6
    assert find_continuation(tokens, 4, 1, 2) == [4, 5, 4, 5]


def test_min_n_respected():
    tokens = [1, 2, 3, 4, 9, 8, 7, 4]
    assert find_continuation(tokens, 2, 1, 3) == [9, 8]
    assert find_continuation(tokens, 2, 2, 3) == []


def test_the_index_answers_as_the_full_search_at_every_length():
    import random

    from verispec.proposers.prompt_lookup import NgramIndex

    rng = random.Random(7)
    for vocab, min_n, max_n in ((3, 1, 3), (5, 2, 4), (40, 1, 2)):
        tokens: list[int] = []
        index = NgramIndex(min_n, max_n)
        for step in range(300):
            tokens.extend(rng.randrange(vocab) for _ in range(rng.choice((1, 1, 2, 5))))  # kept tokens arrive in runs
            k = rng.randrange(0, 9)
            assert index.continuation(tokens, k) == full_search(tokens, k, min_n, max_n), (vocab, step, k)


def test_the_index_refuses_a_shrunk_request():
    import pytest

    from verispec.proposers.prompt_lookup import NgramIndex

    index = NgramIndex(1, 3)
    index.continuation([1, 2, 1, 2], 2)
    with pytest.raises(ValueError, match="only grow"):
        index.continuation([1, 2], 2)
