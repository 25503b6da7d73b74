"""Hybrid linear-attention targets (issue 39): Qwen3-Next and Qwen3.5 (Gated DeltaNet), Bamba and
Granite-4.0-H and Nemotron-H (Mamba-2), whose mixers keep a conv window and a recurrent state per request
(``runtime.mixers``, ``runtime.recurrent_state``).

Every model is tiny, random and saved in transformers' own format (``testing.fixtures.families``); the
reference is transformers' own ``generate``. Speculation must be lossless by construction: a verify step
advances each request's state past all its drafts, and truncating the rejected ones recomputes the state
over the kept positions only. The negative control (rollback switched off) shows that the tests see a
state that kept rejected drafts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import GREEDY, PROMPTS, CapturingReference, fixed_ngram, one_thread  # noqa: F401  (one_thread: autouse)
from safetensors.torch import load_file, save_file

from spec_backend.backends.recurrence import CHUNKED_MIN_TOKENS
from spec_backend.engine import LLM, SamplingParams
from spec_backend.runtime.checkpoint_files import ModelLoadError
from spec_backend.runtime.recurrent_state import RecurrentState
from spec_backend.testing.fixtures.families import make_bigram_draft, make_family_model

HYBRIDS = ["qwen3_next", "qwen3_5", "bamba", "granitemoehybrid", "nemotron_h"]
#: the families whose checkpoints carry MTP layers (``mtp.*``)
WITH_MTP = ["qwen3_next", "qwen3_5"]
#: the families the embedding-to-logits draft (``make_bigram_draft``) agrees with: Granite-4.0-H's tiny
#: embeddings are swamped by its first mixer, so its draft model case is Bamba's (the same Mamba-2 code)
WITH_DRAFT = ["qwen3_next", "qwen3_5", "bamba"]
NGRAM = fixed_ngram(3, 2)
#: a prompt longer than CHUNKED_MIN_TOKENS: its prefill takes the chunked form of the recurrence
LONG = [(7 * i) % 97 + 3 for i in range(CHUNKED_MIN_TOKENS + 9)]
ALL_PROMPTS = [*PROMPTS, LONG]


def _with_mtp(directory: Path, family: str) -> str:
    """``family``'s tiny model with one MTP layer in the published Qwen3-Next / Qwen3.5 names
    (``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``, ``mtp.layers.0.*``). The layer
    is built to guess well: ``fc`` passes the next token's embedding, the block (a copy of the target's
    full-attention layer) adds nothing, ``mtp.norm`` is the target's final norm."""
    path = Path(make_family_model(directory, family))
    tensors = load_file(str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    full, hidden = config["layer_types"].index("full_attention"), config["hidden_size"]
    for name in [n for n in tensors if n.startswith(f"model.layers.{full}.")]:
        block = tensors[name].clone()
        if "o_proj" in name or "down_proj" in name:
            block.zero_()
        tensors["mtp.layers.0." + name[len(f"model.layers.{full}.") :]] = block
    tensors |= {  # zero-centred norms: the scale is 1 + weight
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(hidden),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(hidden),
        "mtp.fc.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1),
        "mtp.norm.weight": tensors["model.norm.weight"].clone(),
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each hybrid family's tiny model, and a plain-attention draft model for each."""
    root = tmp_path_factory.mktemp("hybrids")
    out = {name: make_family_model(root / name, name) for name in HYBRIDS}
    for name in WITH_DRAFT:
        out[f"{name}-draft"] = make_bigram_draft(out[name], root / f"{name}-draft")
    for name in WITH_MTP:
        out[f"{name}-mtp"] = _with_mtp(root / f"{name}-mtp", name)
    return out


def transformers_greedy(path: str, prompt: list[int], max_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    model = model.float().eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens
        )
    return [int(t) for t in out[0, len(prompt) :]]


def greedy(llm: LLM, prompts: list[list[int]] = ALL_PROMPTS) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY)]


def _llm(path: str, spec: dict[str, Any] | None = None, **kwargs: Any) -> LLM:
    return LLM(path, dtype="float32", speculative_config=spec, log_stats_interval=None, **kwargs)


@pytest.mark.parametrize("family", HYBRIDS)
def test_plain_greedy_equals_transformers_generate(family: str, dirs: dict[str, str]) -> None:
    """Batched plain greedy output equals transformers' ``generate`` token for token, prompts of 3 to
    41 tokens together (the longest prefills through the chunked form)."""
    want = [transformers_greedy(dirs[family], p, GREEDY.max_tokens) for p in ALL_PROMPTS]
    assert greedy(_llm(dirs[family])) == want


def _spec(method: str, family: str, dirs: dict[str, str]) -> dict[str, Any]:
    if method == "ngram":
        return NGRAM
    if method == "mtp":
        return {"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2}
    return {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": dirs[f"{family}-draft"],
        "num_speculative_tokens": 3,
    }


SPECULATIVE = (
    [(f, "ngram") for f in HYBRIDS]
    + [(f, "draft_model") for f in WITH_DRAFT]
    + [(f, "mtp") for f in WITH_MTP]
)


@pytest.mark.parametrize(("family", "method"), SPECULATIVE)
def test_greedy_speculative_equals_plain(family: str, method: str, dirs: dict[str, str]) -> None:
    """Speculative greedy output equals plain greedy output, with drafts rejected (so the recurrent state
    was rolled back): ngram, a draft model, and the model's own MTP layer. The draft model and the MTP
    layer are built to agree with the target often, so drafts are accepted too (ngram's acceptance
    depends on how repetitive the random target is)."""
    path = dirs[f"{family}-mtp" if method == "mtp" else family]
    plain = greedy(_llm(path))
    llm = _llm(path, _spec(method, family, dirs))
    assert greedy(llm) == plain
    total = llm.metrics.total
    assert total.num_accepted_tokens < total.num_draft_tokens
    assert method == "ngram" or total.num_accepted_tokens > 0


@pytest.mark.parametrize("family", HYBRIDS)
def test_negative_control_without_rollback_the_output_changes(
    family: str, dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With rollback switched off the state keeps rejected drafts and the output departs from plain
    decoding: the equality above depends on the rollback."""
    plain = greedy(_llm(dirs[family]))
    monkeypatch.setattr(RecurrentState, "rollback", lambda self, slot, current, length: None)
    assert greedy(_llm(dirs[family], NGRAM)) != plain


@pytest.mark.parametrize("family", HYBRIDS)
def test_seeded_sampling_does_not_depend_on_the_batch(family: str, dirs: dict[str, str]) -> None:
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=12)
    others = SamplingParams(temperature=1.0, max_tokens=9)
    for spec in (None, NGRAM):
        llm = _llm(dirs[family], spec)
        alone = llm.generate([PROMPTS[2]], params)[0].outputs[0].token_ids
        batch = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[3]], [others, params, others])
        assert batch[1].outputs[0].token_ids == alone, spec


def test_a_hybrid_draft_model_is_refused(dirs: dict[str, str]) -> None:
    """A draft model rolls back several one-token draft steps at once, which the state cannot: loading
    one as a drafter loads (``recurrence=None``) is refused, naming the layers. (A Qwen3-Next or Qwen3.5
    checkpoint named as a draft model is read as its MTP drafter, vLLM's rule, before this.)"""
    from spec_backend.runtime.loader import load_model
    from spec_backend.runtime.sources import resolve_model

    for family, kind in [("qwen3_5", "Gated DeltaNet"), ("bamba", "Mamba-2")]:
        with pytest.raises(ModelLoadError, match=rf"{kind} \(linear_attention\) .* target model only"):
            load_model(resolve_model(dirs[family]), "eager", torch.float32, torch.device("cpu"))


def test_prefix_caching_is_off_for_hybrids_and_refused_when_asked(dirs: dict[str, str]) -> None:
    """Cached prefixes hold keys and values, not recurrent state: off by default (logged), an error
    naming the reason when asked for."""
    assert _llm(dirs["qwen3_next"]).engine.prefix is None
    with pytest.raises(ValueError, match=r"prefix caching .* keep recurrent state"):
        _llm(dirs["qwen3_next"], enable_prefix_caching=True)
    with pytest.raises(ValueError, match="prefix caching"):
        _llm(dirs["qwen3_next"], prefix_cache_memory_bytes=1 << 20)
    assert _llm(dirs["qwen3_next"], enable_prefix_caching=False).engine.prefix is None


@pytest.mark.parametrize("family", WITH_DRAFT)
def test_captured_verify_steps_roll_back_like_eager_ones(family: str, dirs: dict[str, str]) -> None:
    """Verify steps replayed from captured graphs (placeholders and padding requests included) give the
    plain engine's tokens."""
    plain = greedy(_llm(dirs[family]))
    backend = CapturingReference()
    spec = _spec("draft_model", family, dirs)
    llm = LLM(
        dirs[family], dtype="float32", speculative_config=spec, backend=backend, log_stats_interval=None
    )
    assert greedy(llm) == plain
    assert sum(r.replays for r in backend.runners) > 0


@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h"])
@pytest.mark.parametrize("method", ["suffix", "eagle3"])
def test_suffix_and_eagle3_on_hybrids(family: str, method: str, dirs: dict[str, str], tmp_path: Path) -> None:
    """Suffix decoding (model-free) and an EAGLE-3 head (fed the hybrid target's hidden states, in the
    speculators format) draft on hybrid targets: greedy output equals plain output, drafts rejected."""
    from spec_backend.testing.fixtures import draft_checkpoints as ckpt

    spec: dict[str, Any] = {"adaptive_draft_length": False, "method": "suffix", "num_speculative_tokens": 3}
    if method == "eagle3":
        head = ckpt.write_eagle3(tmp_path / "e3", dirs[family], "speculators", aux_ids=[0, 1, 2])
        spec = {
            "adaptive_draft_length": False,
            "method": "eagle3",
            "model": head,
            "num_speculative_tokens": 3,
        }
    plain = greedy(_llm(dirs[family]))
    llm = _llm(dirs[family], spec)
    assert greedy(llm) == plain
    assert llm.metrics.total.num_accepted_tokens < llm.metrics.total.num_draft_tokens
