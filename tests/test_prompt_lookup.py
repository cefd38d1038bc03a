from verispec.proposers.prompt_lookup import find_continuation


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
