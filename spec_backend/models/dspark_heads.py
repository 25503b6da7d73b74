"""DSpark's two heads on top of its DFlash-style backbone: the Markov head and the confidence head.

Glossary (DeepSpec's ``markov_head.py`` / ``common.py``, the DSpark paper's Eq. 4-7):

* *previous token* ``x_{k-1}`` of draft slot ``k`` — the block's anchor (the last committed token) for
  the first draft, else the draft actually chosen at slot ``k - 1`` (argmax, or the sampled token);
* *Markov embedding* ``e_k = W1[x_{k-1}]`` — ``markov_head.markov_w1 [V, r]``, indexed by target ids;
* *Markov bias* — what is added to slot ``k``'s draft logits ``U_k`` (draft vocabulary):

  - ``vanilla``: ``W2 e_k`` (``markov_head.markov_w2 [Vd, r]``, a linear map without bias);
  - ``gated``: ``W2 (sigmoid(gate_proj([h_k; e_k])) * e_k)``, ``gate_proj [r, H + r]`` with bias;
  - ``rnn``: ``z = [s_{k-1}; e_k; h_k]``, ``(g, c, o) = joint_proj(z)`` split in three (``[3r, 2r + H]``
    with bias), ``s_k = sigmoid(g) * s_{k-1} + (1 - sigmoid(g)) * tanh(c)`` from ``s_0 = 0``, bias
    ``W2 tanh(o)``;

  ``h_k`` is the backbone's final-normed output of slot ``k`` (what the LM head reads);
* *confidence* ``c_k = sigmoid(confidence_head.proj([h_k; e_k]))`` (``[1, H + r]`` with bias; ``[1, H]``
  and no ``e_k`` when ``confidence_head_with_markov`` is false) — the probability that draft ``k`` is
  accepted *given that every draft before it was*; the block's *survival* to ``k`` is ``prod_{i<=k} c_i``.
"""

from __future__ import annotations

import torch

#: ``markov_head_type`` values and what they mean (module docstring)
MARKOV_TYPES = ("vanilla", "gated", "rnn")


class MarkovHead(torch.nn.Module):
    """The low-rank Markov head of one ``markov_head_type`` (module docstring)."""

    def __init__(self, kind: str, hidden: int, rank: int, vocab: int, draft_vocab: int) -> None:
        super().__init__()
        if kind not in MARKOV_TYPES:
            raise ValueError(f"markov_head_type must be one of {list(MARKOV_TYPES)}, got {kind!r}")
        self.kind, self.rank = kind, rank
        self.markov_w1 = torch.nn.Embedding(vocab, rank)
        self.markov_w2 = torch.nn.Linear(rank, draft_vocab, bias=False)
        if kind == "gated":
            self.gate_proj = torch.nn.Linear(hidden + rank, rank)
        if kind == "rnn":
            self.joint_proj = torch.nn.Linear(2 * rank + hidden, 3 * rank)

    def initial_state(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, H] -> [B, r] (s_0 = 0)
        return hidden.new_zeros((hidden.shape[0], self.rank))

    def step(
        self,
        previous: torch.Tensor,  # [B] int64 target ids
        hidden: torch.Tensor,  # [B, H] slot k's normed backbone output
        state: torch.Tensor,  # [B, r] the rnn's s_{k-1} (unused by the other kinds)
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # bias [B, Vd] float, e_k [B, r], s_k [B, r]
        """Slot ``k``'s bias, Markov embedding and the state after it."""
        e = self.markov_w1(previous).to(hidden.dtype)  # [B, r]
        if self.kind == "vanilla":
            mixed = e
        elif self.kind == "gated":
            mixed = torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1))) * e  # [B, r]
        else:
            g, c, o = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)  # [B, r] each
            gate = torch.sigmoid(g)
            state = gate * state + (1 - gate) * torch.tanh(c)
            mixed = torch.tanh(o)
        return self.markov_w2(mixed).float(), e, state


class ConfidenceHead(torch.nn.Module):
    """``proj``: one logit per draft slot (module docstring)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, 1)

    def forward(self, hidden: torch.Tensor, markov: torch.Tensor | None) -> torch.Tensor:
        """``c_k`` ``[B]`` float32 from ``hidden [B, H]`` and the Markov embedding ``[B, r]`` (or none)."""
        features = hidden if markov is None else torch.cat([hidden, markov], dim=-1)  # [B, H (+ r)]
        return torch.sigmoid(self.proj(features).float()).squeeze(-1)


__all__ = ["MARKOV_TYPES", "ConfidenceHead", "MarkovHead"]
