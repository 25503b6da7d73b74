"""The prefix cache's store (``runtime/prefix_cache.py``) on a bare ``RaggedKVCache``: hits are the
longest chain of stored blocks with the same content at the same positions, at most the prompt length
minus one; a hit copies exactly the stored values; eviction is least-recently-used within the byte
budget and takes a block's descendants with it; a budget below one block is refused by name."""

from __future__ import annotations

import pytest
import torch

from spec_backend.runtime.kv_cache import KVLayout, RaggedKVCache
from spec_backend.runtime.prefix_cache import NO_HIT, PrefixCache
from spec_backend.step import build_step_batch

BS = 4
LAYOUT = KVLayout(2, 2, 3, torch.float32, torch.device("cpu"))
BLOCK_BYTES = BS * LAYOUT.bytes_per_position  # 4 positions x 2 layers x 2 heads x (3 + 3) x 4 bytes


def _cache() -> RaggedKVCache:
    return RaggedKVCache(LAYOUT, max_len=64, num_slots=4)


def _fill(cache: RaggedKVCache, length: int, seed: int) -> int:
    """A new slot holding ``length`` positions of random keys and values; its index."""
    slot = cache.add_slot()
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn((2, 2, length, 3), generator=gen)  # [layers, H, n, D]
    cache.append_positions(slot, keys, keys + 100)
    return slot


def _store(prefix: PrefixCache, tokens: list[int], seed: int) -> int:
    cache = prefix.caches[0]
    slot = _fill(cache, len(tokens), seed)
    return prefix.store(slot, tokens, NO_HIT, None, None)


def test_hits_are_whole_matching_blocks_and_never_the_whole_prompt() -> None:
    prefix = PrefixCache([_cache()], BS, 100 * BLOCK_BYTES, needs_hidden=False)
    tokens = list(range(10, 20))  # 10 tokens: blocks [10..13], [14..17]; 18, 19 are no whole block
    assert _store(prefix, tokens, 0) == 2 and len(prefix) == 2
    assert prefix.lookup(tokens).length == 8
    assert prefix.lookup([*tokens, 1, 2, 3]).length == 8
    assert prefix.lookup(tokens[:8]).length == 7  # the last prompt position is always computed
    assert prefix.lookup(tokens[:6]).length == 4  # a hit may end inside a block: the first block only
    assert prefix.lookup(tokens[:1]).length == 0
    assert prefix.lookup([99, *tokens[1:]]).length == 0  # the first block differs
    # the same second block after another first block: keyed by its parent, not found
    assert prefix.lookup([9, 9, 9, 9, *tokens[4:]]).length == 0
    assert (prefix.queried_tokens, prefix.hit_tokens) == (10 + 13 + 8 + 6 + 1 + 10 + 10, 8 + 8 + 7 + 4)


def test_a_salt_keeps_blocks_apart() -> None:
    """Blocks stored under a salt are found under that salt only, and unsalted ones without a salt."""
    prefix = PrefixCache([_cache()], BS, 100 * BLOCK_BYTES, needs_hidden=False)
    tokens = list(range(70, 79))  # two whole blocks
    cache = prefix.caches[0]
    slot = _fill(cache, len(tokens), 13)
    assert prefix.store(slot, tokens, NO_HIT, None, None, "tenant-a") == 2
    assert prefix.lookup(tokens, "tenant-a").length == 8
    assert prefix.lookup(tokens, "tenant-b").length == 0 and prefix.lookup(tokens).length == 0
    assert (
        prefix.store(slot, tokens, NO_HIT, None, None) == 2
    )  # the same tokens unsalted: entries of their own
    assert prefix.lookup(tokens).length == 8 and len(prefix) == 4


def test_a_hit_copies_the_stored_values_exactly() -> None:
    cache = _cache()
    prefix = PrefixCache([cache], BS, 100 * BLOCK_BYTES, needs_hidden=False)
    tokens = list(range(30, 43))  # 13 tokens: 3 whole blocks
    source = _fill(cache, len(tokens), 1)
    assert prefix.store(source, tokens, NO_HIT, None, None) == 3
    hit = prefix.lookup([*tokens, 7])
    assert hit.length == 12
    slot = cache.add_slot()
    assert prefix.load(slot, hit) == [12]
    got_k, got_v = cache.read_positions(slot, 0, 12)
    want_k, want_v = cache.read_positions(source, 0, 12)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_a_drafter_cache_missing_from_an_entry_loads_up_to_it() -> None:
    """An entry stored while the second cache held fewer positions lacks it: that cache's load stops."""
    target, draft = _cache(), _cache()
    prefix = PrefixCache([target, draft], BS, 100 * BLOCK_BYTES, needs_hidden=False)
    tokens = list(range(50, 62))  # 3 whole blocks
    slot = _fill(target, 12, 2)
    assert _fill(draft, 5, 3) == slot  # the drafter filled one block and a bit
    assert prefix.store(slot, tokens, NO_HIT, None, None) == 3
    hit = prefix.lookup([*tokens, 1])
    new_t, new_d = target.add_slot(), draft.add_slot()
    assert new_t == new_d and prefix.load(new_t, hit) == [12, 4]


def test_the_hidden_states_a_drafter_needs_are_stored_with_the_blocks() -> None:
    cache = _cache()
    prefix = PrefixCache([cache], BS, 100 * BLOCK_BYTES, needs_hidden=True)
    tokens = list(range(20, 29))  # 9 tokens: 2 whole blocks
    slot = _fill(cache, 9, 4)
    assert prefix.store(slot, tokens, NO_HIT, None, None) == 0  # without them nothing is stored
    final = torch.arange(9 * 5, dtype=torch.float32).reshape(9, 5)  # [rows, H]
    assert prefix.store(slot, tokens, NO_HIT, final, None) == 2
    hit = prefix.lookup(tokens)
    stored = hit.hidden("final")
    assert hit.length == 8 and stored is not None and torch.equal(stored, final[:8])
    assert hit.hidden("aux") is None


def test_eviction_is_least_recently_used_within_the_budget() -> None:
    prefix = PrefixCache([_cache()], BS, 3 * BLOCK_BYTES, needs_hidden=False)
    a, b = [1] * 8, [2] * 8  # two blocks each
    assert _store(prefix, a, 5) == 2
    assert _store(prefix, b, 6) == 2  # room for one of them: a's second block (its leaf) goes
    assert prefix.nbytes == 3 * BLOCK_BYTES == prefix.max_bytes
    assert prefix.lookup([*a, 0]).length == 4 and prefix.lookup([*b, 0]).length == 8
    c = [3] * 12  # three blocks: everything else goes
    assert _store(prefix, c, 7) == 3
    assert prefix.lookup([*a, 0]).length == 0 and prefix.lookup([*b, 0]).length == 0
    assert prefix.lookup([*c, 0]).length == 12 and prefix.nbytes <= prefix.max_bytes


def test_a_prompt_longer_than_the_budget_keeps_its_first_blocks() -> None:
    """Storing a chain never evicts the chain itself: its first blocks stay, the rest are not stored."""
    prefix = PrefixCache([_cache()], BS, 3 * BLOCK_BYTES, needs_hidden=False)
    assert _store(prefix, [1] * 8, 11) == 2
    long = list(range(60, 80))  # five blocks
    assert _store(prefix, long, 12) == 3  # the other prompt's blocks make room, then the budget is full
    assert prefix.lookup(long).length == 12 and prefix.lookup([1] * 9).length == 0
    assert prefix.nbytes == 3 * BLOCK_BYTES


def test_evicting_a_block_evicts_the_blocks_stored_after_it() -> None:
    prefix = PrefixCache([_cache()], BS, 4 * BLOCK_BYTES, needs_hidden=False)
    chain = [4] * 12  # three blocks, each keyed by its parent
    assert _store(prefix, chain, 8) == 3
    assert prefix.lookup(chain[:5]).length == 4  # only the first block is touched
    assert _store(prefix, [5] * 8, 9) == 2  # one must go: the chain's leaf, not its touched root
    assert prefix.lookup([*chain, 0]).length == 8 and len(prefix) == 4
    root = prefix.lookup(chain[:5]).entries[0]
    prefix._evict(root)
    assert len(prefix) == 2 and prefix.nbytes == 2 * BLOCK_BYTES
    assert prefix.lookup([*chain, 0]).length == 0 and prefix.lookup([5] * 9).length == 8


def test_a_budget_below_one_block_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError, match=rf"prefix_cache_memory_bytes=10 .* >= {BLOCK_BYTES}"):
        PrefixCache([_cache()], BS, 10, needs_hidden=False)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        PrefixCache([_cache()], 0, 10**6, needs_hidden=False)


def test_appending_positions_checks_the_room_and_the_step_plan_sees_them() -> None:
    cache = _cache()
    slot = _fill(cache, 60, 10)
    with pytest.raises(ValueError, match="cannot append 8 positions of 2 layers to slot 0 holding 60"):
        cache.append_positions(slot, torch.zeros(2, 2, 8, 3), torch.zeros(2, 2, 8, 3))
    tokens = torch.zeros((1, 2), dtype=torch.int64)  # [B, Q]
    cache.begin_step(build_step_batch(0, tokens, [2], cache.lengths))
    assert cache.lengths == [62]
    cache.end_step()
