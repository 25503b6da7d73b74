"""``dspark``: DFlash-style block drafting, corrected token by token by a Markov head, with a confidence
head that says how far each block is worth verifying (``spec_backend.models.dspark``).

One forward of the backbone runs the block (its trained ``block_size`` rows, whatever K is); then,
left to right, draft ``k``'s logits are the backbone's plus the Markov bias of the token before it (the
anchor, then the previous draft as chosen), and the draft is their argmax or a sample under the request's
temperature. That corrected distribution — the one the draft was drawn from, given the drafts before it —
is what the sampler receives, so standard and block verification stay lossless. The confidence of draft
``k`` is read alongside and returned in ``DraftOutput.confidence``; the engine decides from it how many
drafts each request sends to verification (``spec_backend.engine.confidence``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import DraftInputs, DraftOutput, empty_drafts
from spec_backend.proposers.dflash import DFlashDrafter
from spec_backend.proposers.draft_sampling import DraftChain
from spec_backend.proposers.dynamic_tree import Grower
from spec_backend.proposers.sibling_draws import sampled_siblings, static_tree_output
from spec_backend.proposers.tree_build import depths_of, fill_static_batch

if TYPE_CHECKING:
    from spec_backend.models.dspark import DSparkHead, DSparkSpec
    from spec_backend.proposers.contract import DrafterContext


class DSparkDrafter(DFlashDrafter):
    """See the module docstring."""

    head: DSparkHead

    def __init__(
        self, head: DSparkHead, spec: DSparkSpec, k: int, max_model_len: int, probabilistic: bool
    ) -> None:
        assert head.spec is not None
        super().__init__(head, head.spec, k, max_model_len, probabilistic)
        self.dspark = spec
        self.reports_confidence = head.confidence_head is not None

    def block_rows(self) -> int:
        return self.dspark.block_size

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        out, block_ids = self.run_block(inputs)  # [B, rows, H], [B, rows]
        k_max = max(inputs.budgets, default=0)
        if k_max == 0:
            return empty_drafts(len(inputs.requests), self.num_speculative_tokens, out.device)
        first = self.dspark.first_row
        hidden = out[:, first : first + k_max]  # [B, k_max, H] the draft rows
        base = self.head.draft_logits(hidden)  # [B, k_max, Vd]
        markov, judge = self.head.markov_head, self.head.confidence_head
        with_markov = self.dspark.confidence_with_markov
        chain = DraftChain(inputs.requests, self.probabilistic, out.device)
        previous = block_ids[:, 0]  # [B] the anchor
        state = markov.initial_state(hidden[:, 0]) if markov is not None else hidden.new_zeros(0)
        confidence: list[torch.Tensor] = []  # each [B]
        for i in range(k_max):  # left to right: each draft is the next one's previous token
            logits, embedding = base[:, i], None  # [B, Vd]
            if markov is not None:
                bias, embedding, state = markov.step(previous, hidden[:, i], state)
                logits = logits + bias
            if judge is not None:
                confidence.append(judge(hidden[:, i], embedding if with_markov else None))
            previous = chain.draw(self.head.to_target(logits))  # [B]
        drafts = chain.output(inputs.budgets)
        return replace(drafts, confidence=torch.stack(confidence, dim=1) if confidence else None)

    @torch.inference_mode()
    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static tree: the children of a node at depth ``d`` are ranked by draft row ``d``'s logits plus
        the Markov bias of that node's token (the anchor for the root), the rnn head's state carried down
        each path — each node's distribution is the one its chain would have."""
        out, block_ids = self.run_block(inputs)  # [B, rows, H]
        first = self.dspark.first_row
        hidden = out[:, first : first + self.num_speculative_tokens]  # [B, K, H]
        base = self.head.draft_logits(hidden)  # [B, K, Vd]
        markov, depths = self.head.markov_head, depths_of(parents)
        states: dict[int, torch.Tensor] = {}  # node -> the Markov state after its children's step

        def logits_at(parent: int, columns: Sequence[torch.Tensor]) -> torch.Tensor:  # -> [B, V]
            row = depths[parent] if parent >= 0 else 0
            logits = base[:, row]
            if markov is not None:
                above = states[parents[parent]] if parent >= 0 else markov.initial_state(hidden[:, 0])
                previous = columns[parent] if parent >= 0 else block_ids[:, 0]  # [B]
                bias, _, states[parent] = markov.step(previous, hidden[:, row], above)
                logits = logits + bias
            return self.head.to_target(logits)

        siblings = sampled_siblings(inputs.requests, self.probabilistic)
        tokens = fill_static_batch(parents, ranks, logits_at, siblings)  # [B, n]
        return static_tree_output(tokens, parents, ranks, siblings)

    @torch.inference_mode()
    def grower(self, inputs: DraftInputs) -> Grower:
        """EAGLE-2's rule over the block (``proposers.dynamic_tree``) and multi-path drafts: a node at
        depth ``d`` gives its children draft row ``d``'s logits plus the Markov bias of its own token, the
        rnn state carried down its path, exactly as ``propose_tree`` ranks a static tree's. A node's
        output is those logits and the Markov state after it, side by side (``[..., Vd + r]``): a level
        runs the Markov head on the fed nodes, never the backbone."""
        out, block_ids = self.run_block(inputs)  # [B, rows, H], [B, rows]
        first = self.dspark.first_row
        hidden = out[:, first : first + self.num_speculative_tokens]  # [B, K, H]
        base = self.head.draft_logits(hidden)  # [B, K, Vd] float32
        dtype = torch.promote_types(base.dtype, hidden.dtype)  # the state travels in it exactly
        markov, vd = self.head.markov_head, base.shape[-1]

        def node_out(rows: torch.Tensor, tokens: torch.Tensor, above: torch.Tensor) -> torch.Tensor:
            """Outputs ``[B, Q, Vd + r]`` of nodes at draft ``rows`` ``[B, Q]`` with ``tokens`` ``[B, Q]``
            under their parents' states ``above`` ``[B, Q, r]``."""
            logits = base.gather(1, rows[..., None].expand(-1, -1, vd)).to(dtype)  # [B, Q, Vd]
            if markov is None:
                return logits
            size = hidden.shape[-1]
            h = hidden.gather(1, rows[..., None].expand(-1, -1, size))  # [B, Q, H]
            state = above.to(hidden.dtype).flatten(0, 1)  # [B*Q, r]
            bias, _, after = markov.step(tokens.flatten(), h.flatten(0, 1), state)
            bias, after = bias.view(*rows.shape, vd), after.view(*rows.shape, -1)  # [B, Q, Vd], [B, Q, r]
            return torch.cat([logits + bias, after.to(dtype)], dim=-1)

        start = markov.initial_state(hidden[:, 0]) if markov is not None else hidden.new_zeros(0)
        zero = torch.zeros_like(block_ids[:, :1])  # [B, 1]
        root = node_out(zero, block_ids[:, :1], start.view(len(inputs.requests), 1, -1))[:, 0]  # [B, Vd + r]

        def forward(columns: Sequence[Sequence[int]], ids: torch.Tensor, above: torch.Tensor) -> torch.Tensor:
            width = ids.shape[1]
            depths = [depths_of(c) + [1] * (width - len(c)) for c in columns]  # padding: any row
            rows = torch.tensor(depths, device=ids.device)  # [B, Q] a node at depth d reads row d
            return node_out(rows, ids, above[..., vd:])  # [B, Q, Vd + r]

        def log_probs(node: torch.Tensor) -> torch.Tensor:  # [..., Vd + r] -> [..., V]
            return torch.log_softmax(self.head.to_target(node[..., :vd]), dim=-1)

        return Grower(root, forward, log_probs)


def build_dspark_drafter(ctx: DrafterContext) -> DSparkDrafter:
    """Load ``speculative_config.model`` (a DeepSpec or speculators DSpark folder) for the target."""
    from spec_backend.models.dspark import load_dspark_head

    config, model = ctx.config, ctx.model_path("a DSpark checkpoint folder")
    target: Any = ctx.target
    head, spec = load_dspark_head(model, target, str(target.config._attn_implementation), target.dtype)
    if ctx.prepare is not None:
        ctx.prepare(head)
    k = config.num_speculative_tokens
    assert k is not None
    if k > spec.max_drafts:
        raise ValueError(
            f"num_speculative_tokens={k} exceeds what the DSpark checkpoint {model!r} drafts per block "
            f"({spec.max_drafts}: block_size {spec.block_size}, "
            f"{'the anchor row predicting' if spec.anchor_predicts else 'the DFlash layout'})"
        )
    if config.confidence_verification in ("throughput", "threshold") and head.confidence_head is None:
        raise ValueError(
            f"confidence_verification={config.confidence_verification!r} needs a confidence head, and the "
            f"DSpark checkpoint {model!r} has none (enable_confidence_head is false or its "
            "confidence_head.proj tensors are absent); use confidence_verification='off'"
        )
    return DSparkDrafter(head, spec, k, ctx.max_model_len, config.uses_draft_probs)


__all__ = ["DSparkDrafter", "build_dspark_drafter"]
