"""The router's choice: a conversation's later turns go where its earlier ones went, unless that
instance is overloaded; tenants' salts and unrelated prompts do not match; round robin cycles."""
from __future__ import annotations

from deepinfer.router.policy import CacheAware, PrefixIndex, RoundRobin, prefix_chain

CHUNK = 16


def _chat(*contents: str, salt: str | None = None) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    return {"model": "m", "messages": msgs, **({"cache_salt": salt} if salt else {})}


def test_a_later_turn_extends_the_earlier_turns_chain():
    first = prefix_chain(_chat("a long first question " * 4), CHUNK)
    later = prefix_chain(_chat("a long first question " * 4, "an answer", "a follow-up"), CHUNK)
    assert first and later[:len(first)] == first


def test_completions_prompts_and_token_ids_chain_by_prefix():
    a = prefix_chain({"prompt": "x" * 64}, CHUNK)
    b = prefix_chain({"prompt": "x" * 64 + "y" * 40}, CHUNK)
    assert len(a) == 4 and b[:4] == a and len(b) == 6
    ids = prefix_chain({"prompt": list(range(40))}, CHUNK)
    assert prefix_chain({"prompt": list(range(60))}, CHUNK)[:len(ids) - 1] == ids[:-1]


def test_salts_never_match_each_other():
    a = prefix_chain(_chat("same text " * 10, salt="a"), CHUNK)
    b = prefix_chain(_chat("same text " * 10, salt="b"), CHUNK)
    assert PrefixIndex(100).matched(b) == 0 and not set(a) & set(b)


def test_conversations_stick_to_their_instance_and_new_ones_spread():
    policy = CacheAware(4, threshold=4)
    loads = [0, 0, 0, 0]
    homes = [policy.choose(prefix_chain(_chat(f"conversation {c} " * 8), CHUNK), loads) for c in range(8)]
    assert sorted(homes) == [0, 0, 1, 1, 2, 2, 3, 3]  # equally loaded: new prefixes take turns
    for c in range(8):
        later = _chat(f"conversation {c} " * 8, "answer", "and then?")
        assert policy.choose(prefix_chain(later, CHUNK), loads) == homes[c]


def test_an_overloaded_instance_gives_way_to_the_least_loaded():
    policy = CacheAware(3, threshold=2)
    chain = prefix_chain(_chat("shared system prompt " * 8), CHUNK)
    home = policy.choose(chain, [0, 0, 0])
    loads = [0, 0, 0]
    loads[home] = 2  # within the threshold: stays
    assert policy.choose(chain, loads) == home
    loads[home] = 3  # above it: the least loaded instead, which now holds the prefix too
    other = policy.choose(chain, loads)
    assert other != home and loads[other] == 0
    assert policy.indexes[other].matched(chain) == len(chain)


def test_index_is_bounded_least_recently_used_first():
    ix = PrefixIndex(3)
    ix.insert([b"a", b"b"])
    ix.insert([b"c"])
    ix.insert([b"a"])  # a is used again: b is now the oldest
    ix.insert([b"d"])
    assert list(ix.entries) == [b"c", b"a", b"d"]


def test_round_robin_cycles_whatever_the_prompt():
    rr = RoundRobin(3)
    chain = prefix_chain(_chat("x" * 100), CHUNK)
    assert [rr.choose(chain, [0, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
