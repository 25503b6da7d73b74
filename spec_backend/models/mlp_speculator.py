"""IBM's MLPSpeculator (``method="mlp_speculator"``), from its published safetensors format.

Config ``{"model_type": "mlp_speculator", "vocab_size", "emb_dim", "inner_dim" (0: emb_dim),
"n_predict", "tie_weights", "scale_input"}``; tensors (an optional ``speculator.`` prefix is stripped)
``emb.{i}.weight [V, inner]``, ``proj.0.weight [inner, emb_dim]``, ``proj.{i>=1}.weight [inner, inner]``,
``head.{i}.weight [V, inner]``, ``ln.{i}.weight/bias [inner]``. With ``tie_weights`` one embedding, head
and norm serve every step (index 0) and ``proj.1`` serves steps >= 1.

Step ``i`` (autoregressive over the heads, no attention)::

    s = proj[i](s) + emb[i](tok) * (ew / sw);  s = gelu(ln[i](s));  tok = draw(head[i](s))

starting from ``s`` = the target's post-norm hidden state of the last committed token (RMS-normalised
and divided by sqrt(2) when ``scale_input``) and ``tok`` = that token's successor (the bonus token), with
``sw = 0.5 ** (0.5 / n_predict)`` and ``ew = sqrt((1 - sw**2) * inner_dim / 2)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from spec_backend.models.checkpoint import check_tensors, read_config, read_tensors


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class MLPSpeculator(torch.nn.Module):
    """See the module docstring; ``tensors`` are the checkpoint's (renamed) weights."""

    def __init__(self, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.n_predict = int(cfg["n_predict"])
        self.inner = int(cfg.get("inner_dim") or cfg["emb_dim"])
        self.scale_input = bool(cfg.get("scale_input", False))
        tied = bool(cfg.get("tie_weights", False))
        self.sw = 0.5 ** (0.5 / self.n_predict)
        self.ew = math.sqrt((1 - self.sw**2) * self.inner / 2)
        self.weights = torch.nn.ParameterDict(
            {k.replace(".", "_"): torch.nn.Parameter(v, requires_grad=False) for k, v in tensors.items()}
        )
        self.tied = tied

    @property
    def dtype(self) -> torch.dtype:
        first: torch.Tensor = next(iter(self.weights.values()))
        return first.dtype

    def _w(self, name: str, i: int, part: str = "weight") -> torch.Tensor:
        index = 0 if self.tied and name != "proj" else (min(i, 1) if self.tied else i)
        weight: torch.Tensor = self.weights[f"{name}_{index}_{part}"]
        return weight

    def step(self, i: int, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One head: ``state [B, D]``, ``tokens [B]`` -> (new state ``[B, inner]``, logits ``[B, V]``)."""
        if i == 0 and self.scale_input:
            state = _rms(state) / math.sqrt(2)
        s = state @ self._w("proj", i).T + self._w("emb", i)[tokens] * (self.ew / self.sw)  # [B, inner]
        s = torch.nn.functional.gelu(_rms(s) * self._w("ln", i) + self._w("ln", i, "bias"))
        return s, s @ self._w("head", i).T


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    v, d, n = int(cfg["vocab_size"]), int(cfg["emb_dim"]), int(cfg["n_predict"])
    inner = int(cfg.get("inner_dim") or d)
    steps = 1 if cfg.get("tie_weights") else n
    shapes: dict[str, tuple[int, ...]] = {"proj.0.weight": (inner, d)}
    for i in range(steps):
        shapes |= {f"emb.{i}.weight": (v, inner), f"head.{i}.weight": (v, inner)}
        shapes |= {f"ln.{i}.weight": (inner,), f"ln.{i}.bias": (inner,)}
    for i in range(1, 2 if cfg.get("tie_weights") else n):
        shapes[f"proj.{i}.weight"] = (inner, inner)
    return shapes


def load_mlp_speculator(path: str, hidden: int, vocab: int) -> MLPSpeculator:
    """Load an MLPSpeculator folder for a target with ``hidden`` size and ``vocab`` tokens (checked)."""
    cfg = read_config("MLPSpeculator", path)
    if (
        cfg.get("emb_dim") != hidden
        or cfg.get("vocab_size") != vocab
        or not isinstance(cfg.get("n_predict"), int)
    ):
        raise ValueError(
            f"MLPSpeculator {path!r} needs emb_dim={hidden}, vocab_size={vocab} (the target's) and an "
            f"integer n_predict; got emb_dim={cfg.get('emb_dim')!r}, vocab_size={cfg.get('vocab_size')!r}, "
            f"n_predict={cfg.get('n_predict')!r}"
        )
    tensors = read_tensors("MLPSpeculator", path, lambda name: name.removeprefix("speculator."))
    expected = expected_shapes(cfg)
    tensors = {k: t for k, t in tensors.items() if k in expected or not cfg.get("tie_weights")}
    check_tensors("MLPSpeculator", path, expected, tensors)
    return MLPSpeculator(cfg, tensors)


__all__ = ["MLPSpeculator", "load_mlp_speculator"]
