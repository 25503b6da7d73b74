"""``extract_hidden_states``: record the target's hidden states at chosen layers, one file per request.

Not a drafter (it proposes nothing; ``num_speculative_tokens`` must be 1, as in vLLM). Configured as in
the vllm-ascend guide::

    speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}
    kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"shared_storage_path": DIR}}

Each finished request writes ``DIR/<run>_<request id>.safetensors`` holding ``token_ids [T]`` (int64) and
``hidden_states [T, n_layers, H]`` (the target's dtype): the residual stream entering each listed layer
(id ``L`` = the last layer's output before the final norm) for every token whose forward ran — the
prompt, then each generated token but the last. The path is reported in the request's
``kv_transfer_params["hidden_states_path"]``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import Drafter, DraftInputs, DraftOutput, DraftRequest, empty_drafts
from spec_backend.step import HiddenStateRequest

if TYPE_CHECKING:
    from spec_backend.proposers.contract import DrafterContext

CONNECTOR = "ExampleHiddenStatesConnector"
ROLE = "kv_producer"


@dataclass
class _Record:
    token_ids: list[torch.Tensor] = field(default_factory=list)  # chunks [t] int64
    hidden: list[torch.Tensor] = field(default_factory=list)  # chunks [t, n, H]


class HiddenStatesExtractor(Drafter):
    """See the module docstring."""

    drafts = False

    def __init__(self, layer_ids: tuple[int, ...], directory: str) -> None:
        self.num_speculative_tokens = 1
        self.hidden_states = HiddenStateRequest(aux_layer_ids=layer_ids)
        self.directory = directory
        self.run_id = uuid.uuid4().hex[:12]
        self._records: dict[str, _Record] = {}

    def add_request(self, request: DraftRequest) -> None:
        self._records[request.request_id] = _Record()

    def remove_request(self, request_id: str) -> None:
        self._records.pop(request_id, None)

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        aux = inputs.target.aux  # [N, n, H]
        if aux is None:
            raise RuntimeError("the target returned no auxiliary hidden states for extract_hidden_states")
        loc = inputs.batch.query_start_loc_host
        for b, request in enumerate(inputs.requests):
            record = self._records.setdefault(request.request_id, _Record())
            first = loc[b]
            rows = loc[b + 1] - first if inputs.accepted.is_prefill else inputs.accepted.num_accepted[b] + 1
            record.token_ids.append(inputs.batch.input_ids[first : first + rows].cpu())
            record.hidden.append(aux[first : first + rows].cpu())
        return empty_drafts(len(inputs.requests), 1, inputs.batch.input_ids.device)

    def finish_request(self, request: DraftRequest) -> dict[str, Any] | None:
        from safetensors.torch import save_file

        record = self._records.get(request.request_id)
        if record is None or not record.hidden:
            return None
        path = os.path.join(self.directory, f"{self.run_id}_{request.request_id}.safetensors")
        tensors = {
            "token_ids": torch.cat(record.token_ids).to(torch.int64).contiguous(),  # [T]
            "hidden_states": torch.cat(record.hidden).contiguous(),  # [T, n, H]
        }
        save_file(tensors, path)
        return {"hidden_states_path": path}


def _layer_ids(ctx: DrafterContext) -> tuple[int, ...]:
    draft = ctx.config.draft_model_config
    raw = draft.hf_config.get("eagle_aux_hidden_state_layer_ids") if draft is not None else None
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw)
    ):
        raise ValueError(
            "extract_hidden_states needs draft_model_config={'hf_config': "
            "{'eagle_aux_hidden_state_layer_ids': [...]}} with a non-empty list of layer ids, "
            f"got {raw!r}"
        )
    target: Any = ctx.target
    config = target.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    bad = [i for i in raw if not 0 <= i <= layers]
    if bad or len(set(raw)) != len(raw):
        raise ValueError(
            f"eagle_aux_hidden_state_layer_ids {raw} must be distinct ids in 0..{layers} (the target has "
            f"{layers} decoder layers; {layers} = the last layer's pre-norm output)"
        )
    return tuple(raw)


def _storage_path(kv: dict[str, Any] | None) -> str:
    if kv is None:
        raise ValueError(
            f"extract_hidden_states needs kv_transfer_config={{'kv_connector': '{CONNECTOR}', 'kv_role': "
            f"'{ROLE}', 'kv_connector_extra_config': {{'shared_storage_path': DIR}}}}"
        )
    if kv.get("kv_connector") != CONNECTOR or kv.get("kv_role") != ROLE:
        raise ValueError(
            f"kv_transfer_config must have kv_connector={CONNECTOR!r} and kv_role={ROLE!r}, got "
            f"kv_connector={kv.get('kv_connector')!r}, kv_role={kv.get('kv_role')!r}"
        )
    extra = kv.get("kv_connector_extra_config")
    path = extra.get("shared_storage_path") if isinstance(extra, dict) else None
    if not isinstance(path, str) or not path:
        raise ValueError(
            f"kv_connector_extra_config.shared_storage_path must be a directory path, got {path!r}"
        )
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"shared_storage_path {path!r} is not a writable directory: {exc}") from None
    return path


def build_extractor(ctx: DrafterContext) -> HiddenStatesExtractor:
    """Validate the configuration (before any work) and build the recorder."""
    k = ctx.config.num_speculative_tokens
    if k != 1:
        raise ValueError(f"extract_hidden_states requires num_speculative_tokens=1, got {k}")
    return HiddenStatesExtractor(_layer_ids(ctx), _storage_path(ctx.kv_transfer_config))


__all__ = ["CONNECTOR", "ROLE", "HiddenStatesExtractor", "build_extractor"]
