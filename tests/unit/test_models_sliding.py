"""Architecture families beyond Llama (issue 39): sliding windows per layer type (Gemma 3, Mistral with a
sliding window, GPT-OSS with attention sinks), mixture of experts (Qwen3-MoE, GPT-OSS), multi-head latent
attention (DeepSeek-V3) and the refusal of what the engine cannot run (``test_the_architecture_table``;
Gated DeltaNet hybrids are in ``test_models_hybrid.py``).

Every model is tiny, random and saved in transformers' own format (``testing.fixtures.families``); the
reference is transformers' own ``generate`` (eager attention, float32: its expert kernels take no
float64). Prompts run longer than the
window (``WINDOW`` = 6 positions), so a windowed layer that attended to everything would show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import GREEDY, PROMPTS, CapturingReference, fixed_ngram, one_thread  # noqa: F401  (one_thread: autouse)

from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing.fixtures.families import WINDOW, make_family_model

RUNS = ["gemma2", "gemma3", "mistral", "gpt_oss", "qwen3_moe", "deepseek_v3"]
NGRAM = fixed_ngram(3, 2)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each family's tiny model, saved once for the module."""
    root = tmp_path_factory.mktemp("families")
    return {name: make_family_model(root / name, name) for name in RUNS}


def transformers_greedy(path: str, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` (eager attention, float32): the reference."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    model = model.float().eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
    return [int(t) for t in out[0, len(prompt) :]]


def greedy(llm: LLM, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY)]


def test_max_model_len_is_the_position_limit_not_the_sliding_window(family_dirs: dict[str, str]) -> None:
    """Mistral with ``sliding_window=6``: the window bounds what a token sees, not the context; a 19-token
    prompt runs and max_model_len is max_position_embeddings (512)."""
    llm = LLM(family_dirs["mistral"], dtype="float32", log_stats_interval=None)
    assert llm.max_model_len == 512
    assert len(greedy(llm, [PROMPTS[2]])[0]) == GREEDY.max_tokens
    with pytest.raises(ValueError, match="max_model_len=600 exceeds the model's limit of 512 positions"):
        LLM(family_dirs["mistral"], max_model_len=600, log_stats_interval=None)


def test_a_folder_without_tokenizer_files_has_no_tokenizer(family_dirs: dict[str, str]) -> None:
    """transformers builds a default Gemma tokenizer (``<eos>`` = 1) for a Gemma folder without tokenizer
    files; the engine must not take its EOS for the model's and end generations at token 1."""
    llm = LLM(family_dirs["gemma3"], dtype="float32", log_stats_interval=None)
    assert llm.tokenizer is None and llm.eos_token_ids == frozenset()


@pytest.mark.parametrize("family", RUNS)
def test_plain_greedy_equals_transformers_generate(family: str, family_dirs: dict[str, str]) -> None:
    """The engine's batched greedy output equals transformers' generate for every prompt, token for
    token: windows per layer type, sinks, expert routing and latent attention all computed as
    transformers computes them."""
    path = family_dirs[family]
    llm = LLM(path, dtype="float32", log_stats_interval=None)
    want = [transformers_greedy(path, p, GREEDY.max_tokens) for p in PROMPTS]
    assert greedy(llm) == want
    assert max(len(p) for p in PROMPTS) + GREEDY.max_tokens > 3 * WINDOW


#: (family, method): every family with ngram, and the draft model being the target itself, except
#: DeepSeek-V3, whose checkpoint named as a draft model is read as its MTP drafter (vLLM's rule)
SPECULATIVE = [(f, "ngram") for f in RUNS] + [(f, "draft_model") for f in RUNS if f != "deepseek_v3"]


@pytest.mark.parametrize(("family", "method"), SPECULATIVE)
def test_greedy_speculative_equals_plain(family: str, method: str, family_dirs: dict[str, str]) -> None:
    """Speculative greedy output equals plain greedy output (verify steps place drafted positions inside
    each layer's window), with drafts accepted; the draft model is the target itself (its own cache of
    the same layout, windows and sinks included)."""
    path = family_dirs[family]
    plain = greedy(LLM(path, dtype="float32", log_stats_interval=None))
    spec: dict[str, Any] = (
        NGRAM
        if method == "ngram"
        else {
            "adaptive_draft_length": False,
            "method": "draft_model",
            "model": path,
            "num_speculative_tokens": 3,
        }
    )
    llm = LLM(path, dtype="float32", speculative_config=spec, log_stats_interval=None)
    assert greedy(llm) == plain
    assert llm.metrics.total.num_accepted_tokens > 0


@pytest.mark.parametrize("family", RUNS)
def test_seeded_sampling_does_not_depend_on_the_batch(family: str, family_dirs: dict[str, str]) -> None:
    """A seeded sampled request gets the same tokens alone and in a batch with other requests, with and
    without speculation."""
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=12)
    others = SamplingParams(temperature=1.0, max_tokens=9)
    for spec in (None, NGRAM):
        llm = LLM(family_dirs[family], dtype="float32", speculative_config=spec, log_stats_interval=None)
        alone = llm.generate([PROMPTS[2]], params)[0].outputs[0].token_ids
        batch = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], [others, params, others])
        assert batch[1].outputs[0].token_ids == alone, spec


def test_sliding_window_mask_in_a_verify_step() -> None:
    """Request 0 verifies 3 query tokens at positions 7..9 with a window of 4: each row sees its own
    position and the 3 before it, drafted positions included; request 1 decodes one token at position 2."""
    from spec_backend.backends.attention import ragged_causal_mask
    from spec_backend.step import RaggedAttentionMetadata

    meta = RaggedAttentionMetadata(query_lens=torch.tensor([3, 1]), kv_lens=torch.tensor([10, 3]))
    mask = ragged_causal_mask(meta, 3, 10, window=4)[:, 0]  # [B, Q, L]
    rows = [[int(v) for v in row] for row in mask[0]]
    assert rows == [
        [0, 0, 0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
    ]
    assert [int(v) for v in mask[1, 0]] == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert mask[1, 1:].any(dim=-1).all()  # padding rows see some key: their softmax stays finite
    full = ragged_causal_mask(meta, 3, 10)[:, 0]
    assert [int(v) for v in full[0, 0]] == [1] * 8 + [0, 0]  # no window: the whole prefix
    assert len(meta.mask_cache) == 2  # one mask per window size, shared by the layers


def test_sinks_and_soft_cap_follow_the_written_out_softmax() -> None:
    """The explicit path: sinks take probability mass without a value, the soft cap bounds the scores."""
    from spec_backend.backends.attention import sdpa_ragged_attention
    from spec_backend.step import RaggedAttentionMetadata

    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 2, 1, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    key, value = key.expand(1, 2, 1, 8).repeat(1, 1, 3, 1), value.repeat(1, 1, 3, 1)  # [1, 2, 3, 8]
    meta = RaggedAttentionMetadata(query_lens=torch.tensor([1]), kv_lens=torch.tensor([3]))
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    out, _ = sdpa_ragged_attention(
        torch.nn.Identity(),
        query,
        key,
        value,
        None,
        scaling=0.3,
        spec_attn_metadata=meta,
        s_aux=sinks,
        softcap=2.0,
    )
    scores = torch.tanh((query @ key.transpose(-1, -2)) * 0.3 / 2.0) * 2.0  # [1, 2, 1, 3]
    weights = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sinks.exp().view(1, 2, 1, 1))
    torch.testing.assert_close(out, (weights @ value).transpose(1, 2))


def test_family_fixture_refuses_an_unknown_family(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown family 'llama4'"):
        make_family_model(tmp_path, "llama4")


@pytest.mark.parametrize(("q_len", "query_lens"), [(4, [4, 1, 3]), (20, [20, 5, 17])])
def test_cpu_batch_invariant_rows_honour_the_window(q_len: int, query_lens: list[int]) -> None:
    """The cpu backend's batch-invariant rows (packed models) see the same window as the reference, in
    verify steps (row by row) and prefills (one masked call per request)."""
    from spec_backend.backends.attention import sdpa_ragged_attention
    from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant
    from spec_backend.step import RaggedAttentionMetadata

    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor(query_lens)
    kv = lens + torch.tensor([9, 0, 4])
    query = torch.randn(3, 4, q_len, 16, generator=gen)
    key, value = (torch.randn(3, 2, int(kv.max()), 16, generator=gen) for _ in range(2))
    meta = RaggedAttentionMetadata(query_lens=lens, kv_lens=kv)
    module = torch.nn.Linear(1, 1)
    mark_batch_invariant(module)
    got, _ = cpu_ragged_attention(module, query, key, value, None, spec_attn_metadata=meta, sliding_window=5)
    want, _ = sdpa_ragged_attention(
        module, query, key, value, None, spec_attn_metadata=meta, sliding_window=5
    )
    full, _ = sdpa_ragged_attention(module, query, key, value, None, spec_attn_metadata=meta)
    for b, q in enumerate(query_lens):
        torch.testing.assert_close(got[b, :q], want[b, :q])
    assert not torch.allclose(want[0, : query_lens[0]], full[0, : query_lens[0]])  # the window matters


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_cpu_backend_packed_windowed_model_speculates_losslessly(
    family: str, family_dirs: dict[str, str]
) -> None:
    """int8 linears make the cpu backend compute batch-invariant attention rows; with a sliding window
    speculative greedy output still equals plain greedy output."""
    llm = LLM(
        family_dirs[family],
        backend="cpu",
        quantization="int8",
        speculative_config=NGRAM,
        log_stats_interval=None,
    )
    speculative = greedy(llm)
    assert llm.metrics.total.num_accepted_tokens > 0
    llm.set_speculation(False)
    assert greedy(llm) == speculative


@pytest.mark.parametrize(
    ("model_type", "settings", "words"),
    [
        ("llama4_text", {}, ["chunked_attention", "chunked local attention"]),
        ("mamba2", {}, ["linear_attention", "recurrent"]),
        ("jamba", {}, ["linear_attention"]),
        ("falcon_h1", {}, ["hybrid", "recurrent state beside the KV cache"]),
        ("gemma3n_text", {}, ["dummy", "KV sharing"]),
        ("deepseek_v32", {}, ["sparse attention whose keys an indexer picks"]),
        ("lfm2", {}, ["short-convolution state"]),
        ("rwkv", {}, ["RWKV's recurrent state"]),
        ("gemma3_text", {"use_bidirectional_attention": True}, ["bidirectional"]),
        ("llama", {}, None),
        ("mistral", {"sliding_window": 8}, None),
        ("gemma2", {}, None),
        ("cohere2", {}, None),
        ("deepseek_v3", {}, None),
    ],
)
def test_the_architecture_table(model_type: str, settings: dict[str, Any], words: list[str] | None) -> None:
    """What runs and what is refused, from transformers' own configs (no weights): every refusal names
    the layer kind or state the engine lacks."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from spec_backend.runtime.architectures import refusal

    reason = refusal(SimpleNamespace(config=AutoConfig.for_model(model_type, **settings)))
    if words is None:
        assert reason is None
        return
    assert reason is not None
    for word in words:
        assert word in reason


def test_a_sliding_layer_that_keeps_its_window_to_itself_is_refused() -> None:
    """A windowed model whose attention module does not hand ``sliding_window=`` to the attention function
    would silently attend to everything: refused."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from spec_backend.runtime.architectures import refusal

    class Attention(torch.nn.Module):
        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return hidden

    layers = [SimpleNamespace(self_attn=Attention())]
    model = SimpleNamespace(config=AutoConfig.for_model("mistral", sliding_window=8), layers=layers)
    assert refusal(model) == "its attention layers do not pass their sliding window to the attention function"


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_captured_steps_slide_like_eager_ones(family: str, method: str, family_dirs: dict[str, str]) -> None:
    """Verify steps (and a draft model's one-token steps) replayed from captured graphs, whose attention
    sees whole cache slots, give the eager engine's tokens."""
    path = family_dirs[family]
    spec: dict[str, Any] = (
        NGRAM
        if method == "ngram"
        else {
            "adaptive_draft_length": False,
            "method": "draft_model",
            "model": path,
            "num_speculative_tokens": 3,
        }
    )
    eager = greedy(LLM(path, dtype="float32", speculative_config=spec, log_stats_interval=None))
    backend = CapturingReference()
    llm = LLM(path, dtype="float32", speculative_config=spec, backend=backend, log_stats_interval=None)
    assert greedy(llm) == eager
    assert sum(r.replays for r in backend.runners) > 0
