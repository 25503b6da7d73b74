"""Target hidden states from the same forward as the logits, for any transformers decoder.

Forward hooks on the decoder layers keep exactly what the active drafter declared
(``HiddenStateRequest``): the residual stream entering layer ``l`` for each aux id ``l`` (id ``L`` =
the last layer's output before the final norm) and the final norm's output. Hooks were chosen over
transformers' ``output_hidden_states`` because they keep only the requested tensors, and because
transformers overwrites the last entry of ``hidden_states`` with the post-norm state, which loses the
pre-norm id ``L`` (``benchmarks/bench_hidden_capture.py`` measures both).
"""

from __future__ import annotations

from typing import Any

import torch

from spec_backend.step import HiddenStateRequest, StepBatch

_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_layer_norm")


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM (``model.get_decoder()`` or ``model.model``)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else getattr(model, "model", None)
    if not isinstance(decoder, torch.nn.Module):
        raise ValueError(f"cannot find the decoder of {type(model).__name__} to read hidden states")
    return decoder


def decoder_layers(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The ``num_layers`` decoder layers (the first ``ModuleList`` of that length in the decoder)."""
    decoder = decoder_of(model)
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_layers:
        return layers
    for module in decoder.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"cannot find {num_layers} decoder layers in {type(model).__name__}")


def _first_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else value[0]


class HiddenCapture:
    """Hooks on ``model`` keeping the states of ``request`` from each forward (see module docstring)."""

    def __init__(self, model: torch.nn.Module, request: HiddenStateRequest, num_layers: int) -> None:
        bad = [i for i in request.aux_layer_ids if isinstance(i, bool) or not 0 <= i <= num_layers]
        if bad:
            raise ValueError(
                f"hidden-state layer ids {bad} are out of range: the target has {num_layers} decoder layers, "
                f"allowed ids are 0..{num_layers} ({num_layers} = the last layer's pre-norm output)"
            )
        self.request = request
        self._store: dict[str, torch.Tensor] = {}
        layers = decoder_layers(model, num_layers)
        for layer_id in request.aux_layer_ids:
            key = f"aux{layer_id}"
            if layer_id < num_layers:
                layers[layer_id].register_forward_pre_hook(self._pre_hook(key), with_kwargs=True)
            else:
                layers[num_layers - 1].register_forward_hook(self._post_hook(key))
        if request.final:
            decoder = decoder_of(model)
            norm = next((getattr(decoder, n) for n in _NORM_NAMES if hasattr(decoder, n)), None)
            if not isinstance(norm, torch.nn.Module):
                raise ValueError(
                    f"cannot find the final norm of {type(model).__name__} (looked for {_NORM_NAMES})"
                )
            norm.register_forward_hook(self._post_hook("final"))

    def _pre_hook(self, key: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._store[key] = _first_tensor(args[0] if args else kwargs["hidden_states"])

        return hook

    def _post_hook(self, key: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self._store[key] = _first_tensor(output)

        return hook

    def collect(self, batch: StepBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This forward's ``final [N, H]`` and ``aux [N, n_aux, H]`` for the batch's valid rows."""
        store, self._store = self._store, {}

        def rows(key: str) -> torch.Tensor:
            padded = store[key]  # [B, Q, H]
            return padded[batch.rows, batch.cols]  # [N, H]

        final = rows("final") if self.request.final else None
        ids = self.request.aux_layer_ids
        aux = torch.stack([rows(f"aux{i}") for i in ids], dim=1) if ids else None  # [N, n, H]
        return final, aux

    def padded(self) -> torch.Tensor:  # [B, Q, n_aux, H]
        """This forward's aux states for every row of the padded batch (a trainer reads whole
        sequences, not the engine's valid rows)."""
        store, self._store = self._store, {}
        return torch.stack([store[f"aux{i}"] for i in self.request.aux_layer_ids], dim=2)


__all__ = ["HiddenCapture", "decoder_layers", "decoder_of"]
