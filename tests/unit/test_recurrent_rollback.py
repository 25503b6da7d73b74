"""Rollback of linear-attention state (issue 39: Gated DeltaNet and Mamba-2), as a property: random
verify steps with random accept patterns, several requests of different query lengths in one batch and a
slot move, against transformers' own layer run over each request's kept sequence at once (its chunked
form: an independent computation).

Noise floor: float32, a sequential scan against a chunked one, outputs of order 1 to 10: they agree to
~3e-6; the tolerance is 1e-4. The negative control (rollback off) misses by more than 1e-2."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from spec_backend.backends.recurrence import REFERENCE_RECURRENCE
from spec_backend.runtime.kv_cache import KVLayout, RaggedKVCache
from spec_backend.runtime.mixers import MIXERS
from spec_backend.runtime.recurrent_state import RecurrentSpec, RecurrentState
from spec_backend.step import build_step_batch
from spec_backend.tools.tiny import TINY_SETTINGS

HIDDEN = TINY_SETTINGS["hidden_size"]
TOLERANCE = 1e-4


def _layer(family: str) -> tuple[Any, Any]:
    """A random mixer of ``family`` (transformers' module) and its config."""
    linear = {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "num_hidden_layers": 1,
        "layer_types": ["linear_attention"],
    }
    torch.manual_seed(0)
    if family == "bamba":
        from transformers import BambaConfig
        from transformers.models.bamba.modeling_bamba import BambaMixer

        mamba = {"mamba_n_heads": 4, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_chunk_size": 16}
        config: Any = BambaConfig(**{**TINY_SETTINGS, "num_hidden_layers": 1, **mamba})
        inner: Any = BambaMixer(config, 0)
        with torch.no_grad():
            inner.A_log.copy_(torch.log(torch.rand(4) * 4 + 0.5))
            inner.D.copy_(torch.randn(4))
            inner.dt_bias.copy_(torch.randn(4))
            inner.out_proj.weight.mul_(5)
        return inner.eval(), config
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

        config = Qwen3NextConfig(**{**TINY_SETTINGS, **linear})
        inner = Qwen3NextGatedDeltaNet(config, 0)
    else:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

        config = Qwen3_5TextConfig(**{**TINY_SETTINGS, **linear})
        inner = Qwen3_5GatedDeltaNet(config, 0)
    with torch.no_grad():
        inner.dt_bias.copy_(torch.randn_like(inner.dt_bias))
        inner.norm.weight.copy_(1 + 0.5 * torch.randn_like(inner.norm.weight))
    return inner.eval(), config


def _cache(config: Any, slots: int) -> RaggedKVCache:
    layout = KVLayout(
        1, 1, 8, torch.float32, torch.device("cpu"), states=((0, RecurrentSpec.from_config(config)),)
    )
    return RaggedKVCache(layout, max_len=256, num_slots=slots, headroom=4)  # K = 4: steps of up to 5


def _wrap(inner: Any) -> Any:
    """The engine's wrapper of ``inner`` (from the one registry of mixers)."""
    return next(wrapper for _, known, wrapper in MIXERS if known(inner))(inner, REFERENCE_RECURRENCE)


def _step(layer: Any, cache: RaggedKVCache, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """One forward over slots ``0..len(rows)-1``, row ``b`` feeding ``rows[b]`` ``[q_b, E]``; returns each
    row's outputs ``[q_b, E]``."""
    lens = [int(r.shape[0]) for r in rows]
    q_max = max(lens)
    hidden = torch.zeros(len(rows), q_max, HIDDEN)  # [B, Q, E]
    for b, r in enumerate(rows):
        hidden[b, : lens[b]] = r
        hidden[b, lens[b] :] = 50 * torch.randn(q_max - lens[b], HIDDEN)  # padding: must not leak
    tokens = torch.zeros(len(rows), q_max, dtype=torch.int64)
    batch = build_step_batch(0, tokens, lens, cache.lengths[: len(rows)])
    cache.begin_step(batch)
    try:
        with torch.no_grad():
            out = layer(hidden, cache=cache)  # [B, Q, E]
    finally:
        cache.end_step()
    return [out[b, : lens[b]] for b in range(len(rows))]


def _run(family: str, seed: int) -> float:
    """Random steps over 3 requests (one leaves half-way, the last slot moving into its place); returns
    the largest distance of a kept output from transformers' layer over the kept sequence."""
    inner, config = _layer(family)
    layer = _wrap(inner)
    cache, rng = _cache(config, 3), random.Random(seed)
    truth = [torch.randn(60, HIDDEN) for _ in range(3)]  # each request's true input sequence
    kept: list[list[torch.Tensor]] = [[] for _ in range(3)]
    fed = [0, 0, 0]  # true positions each request has consumed
    live = [0, 1, 2]  # request in each slot
    for _ in range(3):
        cache.add_slot()
    for step in range(12):
        if step == 6:  # request 0 leaves: the last slot moves into slot 0
            cache.move_slot(2, 0)
            cache.pop_slot()
            live = [live[2], live[1]]
        rows, accepted = [], []
        for r in live:
            first = rng.randint(3, 9) if step == 0 else 1  # a prefill (no drafts), then verify steps
            drafts = 0 if step == 0 else rng.randint(0, 4)
            a = rng.randint(0, drafts)
            real = truth[r][fed[r] : fed[r] + first + a]
            rows.append(torch.cat([real, 3 * torch.randn(drafts - a, HIDDEN)]))
            accepted.append(first + a)
        outs = _step(layer, cache, rows)
        for slot, (r, keep, out) in enumerate(zip(live, accepted, outs, strict=True)):
            cache.truncate(slot, fed[r] + keep)
            kept[r].append(out[:keep])
            fed[r] += keep
    worst = 0.0
    for r in range(3):
        with torch.no_grad():
            want = inner(truth[r][None, : fed[r]])[0]  # [n, E], no cache: from zero state
        worst = max(worst, float((torch.cat(kept[r]) - want).abs().max()))
    return worst


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "bamba"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_accept_patterns_match_the_kept_sequence(family: str, seed: int) -> None:
    assert _run(family, seed) < TOLERANCE


@pytest.mark.parametrize("family", ["qwen3_next", "bamba"])
def test_negative_control_without_rollback_it_misses(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RecurrentState, "rollback", lambda self, slot, current, length: None)
    assert _run(family, 0) > 1e-2


def test_a_truncation_past_the_last_step_is_refused() -> None:
    """Only the last step's positions can be rolled back: asking for more is an error, never a silently
    wrong state."""
    inner, config = _layer("qwen3_next")
    layer, cache = _wrap(inner), _cache(config, 1)
    cache.add_slot()
    _step(layer, cache, [torch.randn(5, HIDDEN)])
    _step(layer, cache, [torch.randn(3, HIDDEN)])
    cache.truncate(0, 6)  # inside the last step: fine
    with pytest.raises(
        RuntimeError, match="cannot roll back to 4: only the first 6 positions of the last step"
    ):
        cache.truncate(0, 4)
    assert cache.lengths == [6]


def test_a_fresh_slot_starts_from_zero_state() -> None:
    """A slot reused by a new request holds no state of the old one."""
    inner, config = _layer("qwen3_next")
    layer, cache = _wrap(inner), _cache(config, 1)
    x = torch.randn(4, HIDDEN)
    cache.add_slot()
    first = _step(layer, cache, [x])[0]
    cache.pop_slot()
    cache.add_slot()
    torch.testing.assert_close(_step(layer, cache, [x])[0], first, rtol=0, atol=0)


def test_the_layer_refuses_a_cache_without_state() -> None:
    inner, _ = _layer("qwen3_next")
    with pytest.raises(RuntimeError, match="runs on the engine's cache only"):
        _wrap(inner)(torch.randn(1, 2, HIDDEN), cache=None)


def test_the_step_record_lives_in_buffers_allocated_at_start_up() -> None:
    """A captured graph's replay runs no Python: whatever a rollback reads must be written by the step's
    own tensor copies into buffers allocated once. After steps of different batch sizes, every tensor the
    state layer holds is one it allocated at start-up, at the same address."""
    inner, config = _layer("bamba")
    layer, cache = _wrap(inner), _cache(config, 3)
    state = next(x for x in cache.layers if isinstance(x, RecurrentState))

    def tensors(value: object, name: str) -> dict[str, int]:
        if isinstance(value, torch.Tensor):
            return {name: value.data_ptr()}
        if isinstance(value, (list, tuple)):  # named tuples included
            return {k: v for i, x in enumerate(value) for k, v in tensors(x, f"{name}.{i}").items()}
        return {}

    def held() -> dict[str, int]:
        return {k: v for name, value in vars(state).items() for k, v in tensors(value, name).items()}

    at_start = held()
    for _ in range(3):
        cache.add_slot()
    _step(layer, cache, [torch.randn(4, HIDDEN), torch.randn(2, HIDDEN)])
    _step(layer, cache, [torch.randn(3, HIDDEN), torch.randn(1, HIDDEN), torch.randn(5, HIDDEN)])
    assert held() == at_start
