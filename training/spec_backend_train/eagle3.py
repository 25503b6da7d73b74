"""Training an EAGLE-3 head with training-time test (TTT), saved in the ``speculators`` format.

Glossary:

* *features* — the residual streams entering the three auxiliary target layers, ``[T, 3H]``; the head's
  ``fc`` turns them into ``g [T, H]``;
* *teacher* — the target's own next-token distribution, recomputed from the last layer's pre-norm
  output (final norm + LM head) and restricted to the draft vocabulary; the loss is
  ``KL(teacher || draft)``, so no text has to be generated;
* *TTT step j* — row ``t`` at step ``j`` feeds the head's own step ``j-1`` output and argmax draft and
  predicts token ``t + 2 + j``; it attends to the real rows ``<= t`` of step 0 and to its own rows of
  steps ``1..j`` (``ttt_mask``), exactly what the head sees when it drafts ``j + 1`` tokens ahead.

The head is ``spec_backend.models.eagle3.Eagle3Head`` (the inference module itself, run with transformers'
SDPA attention and explicit masks), so what is trained is what is served.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from spec_backend.models.eagle3 import Eagle3Head, Eagle3Spec, default_aux_layer_ids


@dataclass(frozen=True)
class TrainConfig:
    """What the trainer needs: auxiliary layer ids, draft vocabulary (``d2t``/``t2d``), TTT depth."""

    aux_layer_ids: tuple[int, int, int]
    d2t: torch.Tensor  # [Vd] int64 offsets
    t2d: torch.Tensor  # [V] bool
    ttt_steps: int = 3
    lr: float = 3e-4
    seed: int = 0
    state_ids: tuple[int, ...] = ()  # layer ids of the extracted files' columns (default: aux, then L)
    total_steps: int = 0  # optimiser steps of the whole run: cosine decay to lr/10 (0: constant lr)
    norm_before_fc: bool = False  # an RMSNorm over the concatenated features before ``fc``
    init_from_target: bool = False  # start from the target layer that reads the last aux feature
    bf16: bool = False  # mixed precision: the head's matmuls in bfloat16 (autocast), weights in float32
    init_head: str | None = None  # a trained head's folder (speculators format) to continue training from
    qat_int4: bool = False  # train through the int4 drafter's weight rounding (``spec_backend_train.quant``)


def layer_ids(num_layers: int) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """The head's auxiliary layer ids for a target of ``num_layers`` layers and the ids of the states a
    trainer reads (aux and ``L``, the last layer's pre-norm output; distinct, ascending: the default aux
    ids repeat on small targets)."""
    aux = default_aux_layer_ids(num_layers)
    return aux, tuple(sorted({*aux, num_layers}))


@torch.no_grad()
def copy_target_layer(head: Eagle3Head, target: Any, layer_id: int) -> None:
    """Start ``head`` as the target's decoder layer ``layer_id`` applied to that layer's own input.

    ``fc`` passes the last auxiliary feature (the residual stream entering ``layer_id``) through
    unchanged; the layer's weights are the target's, with the embedding half of ``q/k/v`` zero, and
    ``hidden_norm`` is the target layer's input norm. The untrained head's output is then exactly the
    target's residual stream after ``layer_id`` (``training/tests/test_training_eagle3.py``), a far better
    start than random weights: the head begins with the target's attention and MLP of that depth.
    """
    from spec_backend.runtime.hidden import decoder_of

    decoder: Any = decoder_of(target)
    source, owner = decoder.layers[layer_id], cast(Any, head)
    first, fc = owner.layers[0], owner.fc
    hidden = int(first.hidden_norm.weight.numel())
    if fc is None or fc.weight.shape != (hidden, 3 * hidden) or owner.input_norm is not None:
        raise ValueError("copy_target_layer needs fc [H, 3H] without norm_before_fc and H = the target's")
    wanted = dict(source.named_parameters())
    for name, param in first.named_parameters():
        weight = wanted.get(name)
        if weight is None:
            continue
        if param.shape == weight.shape:
            param.copy_(weight)
        elif param.shape[:-1] == weight.shape[:-1] and param.shape[-1] == 2 * weight.shape[-1]:
            param.zero_()  # q/k/v over [embedding; hidden]: the hidden half is the target's
            param[..., weight.shape[-1] :].copy_(weight)
        else:
            raise ValueError(f"head parameter {name} {list(param.shape)} does not fit {list(weight.shape)}")
    first.hidden_norm.weight.copy_(source.input_layernorm.weight)
    fc.weight.zero_()
    fc.weight[:, 2 * hidden :].copy_(torch.eye(hidden))  # [H, 3H]: g = the last aux feature


def ttt_mask(length: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Which keys each query row may see at TTT ``step``: ``[1, 1, T, (step + 1) · T]`` bool (module
    docstring): causal over step 0, then only its own row in each later step."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    own = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal, *[own] * step], dim=1)[None, None]


def epoch_order(count: int, shuffle: int | None, epoch: int) -> list[int]:
    """The order of ``count`` files in one epoch: as given, or a permutation drawn from the seed
    ``shuffle + epoch``."""
    if shuffle is None:
        return list(range(count))
    return torch.randperm(count, generator=torch.Generator().manual_seed(shuffle + epoch)).tolist()


def lr_factor(total_steps: int, warmup: int = 20) -> Callable[[int], float]:
    """The learning-rate multiplier at each optimiser step: a linear warm-up over ``warmup`` steps, then
    a cosine decay from 1 to 0.1 at ``total_steps`` (held at 0.1 beyond); constant 1 when
    ``total_steps`` is 0."""

    def factor(step: int) -> float:
        if total_steps <= 0:
            return 1.0
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))

    return factor


def head_tensors(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The head's own state (the target's shared embedding left out): what is saved and restored."""
    return {n: t for n, t in head.state_dict().items() if not n.startswith("embed.")}


@torch.no_grad()
def load_head_weights(head: Eagle3Head, folder: str, d2t: torch.Tensor) -> None:
    """Start ``head`` from the weights of a head this trainer saved (``model.safetensors`` in
    ``folder``): every tensor the head trains must be there with its shape, and the draft vocabulary
    (``d2t``) must be this run's — another vocabulary would put each LM-head row on another token."""
    from safetensors.torch import load_file

    path = os.path.join(folder, "model.safetensors")
    if not os.path.exists(path):
        raise FileNotFoundError(f"init_head: no model.safetensors in {folder!r} (a speculators-format head)")
    saved = load_file(path)
    if "d2t" not in saved or not torch.equal(saved["d2t"].to(torch.int64), d2t.to(torch.int64)):
        raise ValueError(
            f"init_head {folder!r} has another draft vocabulary than this run's ({d2t.numel()} ids from "
            "this training data): train it with the same --draft-vocab and data, or start afresh"
        )
    own = head_tensors(head)
    wrong = [f"{n} {tuple(saved[n].shape)} (head {tuple(t.shape)})" for n, t in own.items()
             if n in saved and saved[n].shape != t.shape]  # fmt: skip
    missing = sorted(set(own) - set(saved))
    if wrong or missing:
        raise ValueError(f"init_head {folder!r} does not fit this head: missing {missing}, shapes {wrong}")
    head.load_state_dict({n: saved[n].to(t.dtype) for n, t in own.items()}, strict=False)


def _batched(tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence (``[T]``, ``[T, n, H]``) as a batch of one; a batch (``[B, T]``, ...) unchanged."""
    return (tokens[None], hidden[None]) if tokens.dim() == 1 else (tokens, hidden)


class Eagle3Trainer:
    """Trains one EAGLE-3 head for the target at ``target_dir``: loaded float32 on the CPU, or the
    already loaded ``target`` (any dtype and device; the head trains in float32 on its device)."""

    def __init__(self, target_dir: str, config: TrainConfig, target: Any | None = None) -> None:
        from spec_backend.runtime.loader import load_model
        from spec_backend.runtime.sources import resolve_model

        torch.manual_seed(config.seed)
        self.target_dir, self.config = target_dir, config
        if target is None:
            target = load_model(resolve_model(target_dir), "sdpa", torch.float32, torch.device("cpu"))
        self.target: Any = target.eval()
        self.device: torch.device = next(self.target.parameters()).device
        text = self.target.config.get_text_config()
        layer = copy.deepcopy(text)
        layer.num_hidden_layers = 1
        layer._attn_implementation = "sdpa"
        spec = Eagle3Spec(
            layer_config=layer,
            model_type=str(text.model_type),
            draft_vocab_size=int(config.d2t.numel()),
            target_hidden_size=int(text.hidden_size),
            norm_before_residual=False,
            norm_before_fc=config.norm_before_fc,
            use_aux_hidden_state=True,
            aux_layer_ids=config.aux_layer_ids,
            speculators=True,
        )
        embed = self.target.get_input_embeddings()
        embed.weight.requires_grad_(False)
        self.head = Eagle3Head(spec, embed, None).to(self.device)
        self.ids = (torch.arange(config.d2t.numel()) + config.d2t).to(self.device)  # [Vd] target ids
        head: Any = self.head
        with torch.no_grad():  # start from the target's own LM head rows and final norm
            head.lm_head.weight.copy_(self.target.get_output_embeddings().weight[self.ids])
            head.norm.weight.copy_(self._final_norm().weight)
            head.d2t.copy_(config.d2t)
        if config.init_head is not None:  # every trained tensor comes from the head: no layer to copy
            load_head_weights(self.head, config.init_head, config.d2t)
        elif config.init_from_target:
            copy_target_layer(self.head, self.target, config.aux_layer_ids[-1])
        self.head.target_ids = self.ids
        layers = int(text.num_hidden_layers)
        ids = config.state_ids or (*config.aux_layer_ids, layers)
        if layers not in ids or not set(config.aux_layer_ids) <= set(ids):
            raise ValueError(
                f"state_ids {list(ids)} must hold the aux ids {list(config.aux_layer_ids)} and {layers}"
            )
        self.columns = ([ids.index(i) for i in config.aux_layer_ids], ids.index(layers))
        params = [p for n, p in self.head.named_parameters() if not n.startswith("embed.")]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr)
        self._factor = lr_factor(config.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self._factor(s))
        # [Vd, H] the target's LM-head rows of the draft vocabulary (the teacher needs no other logits)
        self.teacher_rows = self.target.get_output_embeddings().weight[self.ids].detach().float()

    def reschedule(self, total_steps: int) -> None:
        """Plan the cosine decay for ``total_steps`` optimiser steps from now on (the steps already taken
        keep counting): a run with a time budget sets it once it has measured its speed."""
        self._factor = lr_factor(total_steps)

    def _final_norm(self) -> Any:
        from spec_backend.runtime.hidden import decoder_of

        return decoder_of(self.target).norm

    @torch.no_grad()
    def teacher(self, last: torch.Tensor) -> torch.Tensor:  # [T, H] pre-norm -> [T, Vd] probabilities
        with torch.autocast(self.device.type, enabled=False):  # float32 targets, also under bf16 training
            logits = torch.nn.functional.linear(self._final_norm()(last).float(), self.teacher_rows)
        return torch.softmax(logits, dim=-1)  # [..., Vd]

    def unroll(self, tokens: torch.Tensor, hidden: torch.Tensor) -> Iterator[torch.Tensor]:
        """The head's draft logits ``[B, T, Vd]`` at each TTT step for sequences ``tokens [B, T]``
        (or one, ``[T]``) with ``hidden [B, T, n, H]`` (columns ``state_ids``): row ``t`` of step ``j``
        predicts token ``t + 2 + j``; each step reads the previous step's outputs and argmax drafts.
        Right padding is harmless: a row sees no later row of step 0 and only itself in later steps."""
        from transformers import DynamicCache

        tokens, hidden = _batched(tokens, hidden)
        batch, length = tokens.shape
        aux, _ = self.columns
        g = self.head.combine(hidden[:, :, aux].flatten(2).float())  # [B, T, H]
        ids = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)  # [B, T] row t reads token t + 1
        positions = torch.arange(length, device=tokens.device).expand(batch, length)  # [B, T]
        cache = DynamicCache()
        for step in range(self.config.ttt_steps):
            mask = ttt_mask(length, step, tokens.device)
            g = self.head(ids, g, positions + step, cache, None, attention_mask=mask)
            logits = self.head.draft_logits(g)  # [B, T, Vd] float
            yield logits
            ids = self.ids[logits.argmax(-1)]  # [B, T] the head's own drafts, as target ids

    def loss(
        self, tokens: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean TTT loss of one sequence (``tokens [T]``, ``hidden [T, n, H]``, columns ``state_ids``)
        or of a right-padded batch (``[B, T]``, ``[B, T, n, H]``, true ``lengths [B]``): the mean over
        steps and sequences of each sequence's mean KL over its rows."""
        tokens, hidden = _batched(tokens, hidden)
        steps, length = self.config.ttt_steps, tokens.shape[1]
        if lengths is None:
            lengths = torch.full((tokens.shape[0],), length, device=tokens.device)
        if int(lengths.min()) < steps + 2:
            raise ValueError(
                f"a training sequence needs at least {steps + 2} tokens, got {int(lengths.min())}"
            )
        teacher = self.teacher(hidden[:, :, self.columns[1]])  # [B, T, Vd]
        rows = torch.arange(length, device=tokens.device)  # [T]
        total = torch.zeros((), device=tokens.device)
        for step, logits in enumerate(self.unroll(tokens, hidden)):
            log_q = torch.log_softmax(logits, dim=-1)  # [B, T, Vd]
            span = length - 1 - step  # row t predicts token t + 2 + step: teacher row t + 1 + step
            p = teacher[:, 1 + step :]  # [B, span, Vd]
            kl = (p * (torch.log(p.clamp_min(1e-30)) - log_q[:, :span])).sum(-1)  # [B, span]
            valid = rows[None, :span] < (lengths[:, None] - 1 - step)  # [B, span]
            kl = torch.where(valid, kl, 0.0)
            total = total + (kl.sum(1) / valid.sum(1)).mean()
        return total / steps

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor | None = None) -> float:
        """One optimiser step on one sequence or a padded batch (``loss``); returns its loss."""
        from spec_backend_train.quant import int4_linears, int4_weights

        self.optimizer.zero_grad()
        with int4_weights(int4_linears(self.head) if self.config.qat_int4 else []):  # QAT: round-trip weights
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
                loss = self.loss(tokens, hidden, lengths)
            loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach())

    def train(
        self,
        files: Sequence[str],
        epochs: int = 1,
        max_len: int = 2048,
        progress: Callable[[int, float], None] | None = None,
        shuffle: int | None = None,
    ) -> list[float]:
        """``epochs`` passes over the extracted ``files`` (chunks of ``max_len`` rows), in order, or in
        an order drawn from the seed ``shuffle`` (a new order each epoch)."""
        from spec_backend_train.data import load

        losses: list[float] = []
        for epoch in range(epochs):
            for path in (files[i] for i in epoch_order(len(files), shuffle, epoch)):
                tokens, hidden = load(path)
                for start in range(0, tokens.numel(), max_len):
                    chunk = slice(start, start + max_len)
                    if tokens[chunk].numel() >= self.config.ttt_steps + 2:
                        losses.append(self.step(tokens[chunk], hidden[chunk]))
                        if progress is not None:
                            progress(len(losses), losses[-1])
        return losses

    def checkpoint(self, path: str, epoch: int) -> None:
        """Save the head (without the target's embedding) and the optimiser after ``epoch`` epochs."""
        head = head_tensors(self.head)
        optimizer, scheduler = self.optimizer.state_dict(), self.scheduler.state_dict()
        torch.save({"head": head, "optimizer": optimizer, "scheduler": scheduler, "epoch": epoch}, path)

    def restore(self, path: str) -> int:
        """Load a ``checkpoint`` if ``path`` exists; returns the epochs it had completed (0 if none)."""
        if not os.path.exists(path):
            return 0
        state = torch.load(path, weights_only=True, map_location=self.device)
        self.head.load_state_dict(state["head"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        return int(state["epoch"])

    def save(self, out_dir: str, dtype: torch.dtype = torch.float32) -> str:
        """Write the head in the ``speculators`` format (config.json + model.safetensors)."""
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        tensors = {
            n: (t.to(dtype) if t.is_floating_point() else t).detach().cpu().contiguous()
            for n, t in head_tensors(self.head).items()
        }
        tensors["t2d"] = self.config.t2d.clone()
        save_file(tensors, os.path.join(out_dir, "model.safetensors"))
        layer = {k: v for k, v in self.head.config.to_dict().items() if not k.startswith("_")}
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "draft_vocab_size": int(self.config.d2t.numel()),
            "norm_before_residual": False,
            "norm_before_fc": self.config.norm_before_fc,
            "eagle_aux_hidden_state_layer_ids": list(self.config.aux_layer_ids),
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {"proposal_type": "greedy", "speculative_tokens": self.config.ttt_steps}
                ],
                "verifier": {
                    "name_or_path": self.target_dir,
                    "architectures": self.target.config.architectures,
                },
            },
        }
        with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        return out_dir


__all__ = [
    "Eagle3Trainer",
    "TrainConfig",
    "copy_target_layer",
    "epoch_order",
    "head_tensors",
    "layer_ids",
    "load_head_weights",
    "lr_factor",
    "ttt_mask",
]
