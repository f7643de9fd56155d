"""The ngram drafter's lookup: the latest longest match, and the incremental suffix index against
the full scan."""
from __future__ import annotations

import random

import pytest

from deepinfer_builtin.drafters.ngram import SuffixIndex, ngram_continuation


def test_ngram_finds_the_latest_longest_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    assert ngram_continuation(toks, 3, 2, 2) == [8, 5]
    assert ngram_continuation([4, 5, 6], 3, 2, 2) == []


@pytest.mark.parametrize("max_n,min_n", [(4, 2), (3, 1), (2, 2)])
def test_suffix_index_matches_the_scan_as_a_sequence_grows(max_n, min_n):
    """The incremental index gives the full scan's continuation after every growth of one to six
    tokens (small vocabularies, so that matches of every length occur), and the match's length."""
    rng = random.Random(max_n * 10 + min_n)
    for vocab in (3, 6):
        tokens, index = [], SuffixIndex(max_n, min_n)
        found = 0
        while len(tokens) < 300:
            tokens += [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            cont, n = index.lookup(tokens, 5)
            assert cont == ngram_continuation(tokens, max_n, min_n, 5)
            if cont:
                found += 1
                assert tokens[-n:] == tokens[len(tokens) - n:] and n >= min_n
                assert ngram_continuation(tokens, n, n, 5) == cont  # a match of exactly that length
                assert not any(ngram_continuation(tokens, m, m, 5) for m in range(n + 1, max_n + 1))
        assert found > 20
    # given a shorter sequence than it has indexed (another sequence), it starts over
    index = SuffixIndex(max_n, min_n)
    index.lookup([3, 3, 1, 2, 4, 4, 4, 4, 1, 2], 5)
    assert index.lookup([1, 2, 5, 1, 2], 5) == ([5, 1, 2], 2)
