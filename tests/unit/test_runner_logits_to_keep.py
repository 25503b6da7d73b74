"""The runner on transformers releases whose causal LMs cannot take a boolean ``[B, Q]`` ``logits_to_keep``.

transformers 5.17 (the one on the GPU machine of #17) sliced ``hidden[:, logits_to_keep, :]``: a 2-D
mask raised "too many indices for tensor of dimension 3" and every request failed. Such a release is
simulated here: ``modeling_utils`` without ``slice_logits_to_keep`` and Llama's forward slicing the old
way. The runner must then ask for every row and select the kept ones itself: the same tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS

from spec_backend.engine import LLM
from spec_backend.runtime.runner import boolean_logits_to_keep
from spec_backend.tools.tiny import make_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def _old_slice(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """transformers 5.17's slicing: an int keeps the last positions, a tensor indexes dimension 1."""
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, keep, :]


@pytest.mark.parametrize("spec", [None, NGRAM], ids=["plain", "ngram"])
def test_old_transformers_slicing_gives_the_same_tokens(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, spec: dict[str, object] | None
) -> None:
    import transformers.modeling_utils as modeling_utils
    import transformers.models.llama.modeling_llama as modeling_llama

    if not boolean_logits_to_keep():  # make test-transformers-min: the release runs the old slicing itself
        pytest.skip("this transformers release (5.17 or earlier) slices the old way: nothing to simulate")
    model = make_tiny_model(str(tmp_path), "llama")
    expected = [o.outputs[0].token_ids for o in LLM(model, speculative_config=spec).generate(PROMPTS, GREEDY)]
    monkeypatch.delattr(modeling_utils, "slice_logits_to_keep")
    monkeypatch.setattr(modeling_llama, "slice_logits_to_keep", _old_slice)
    assert not boolean_logits_to_keep()
    outs = LLM(model, speculative_config=spec).generate(PROMPTS, GREEDY)
    assert [o.outputs[0].error for o in outs] == [None] * len(PROMPTS)
    assert [o.outputs[0].token_ids for o in outs] == expected
