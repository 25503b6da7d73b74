"""``dflash``: block drafting — all K drafts of a step from one forward of the DFlash head.

After each step the drafter writes the committed tokens' target features into its cache as context
(a prefill's prompt rows, or a decode step's first row plus one per accepted draft; rows never hold
drafts, so nothing is recomputed), then runs the block ``[last committed token, MASK × K]`` at the
positions that follow and reads draft ``i`` from block row ``i`` (``spec_backend.models.dflash``).
Drafts are argmax or sampled per position from that forward's distributions (``draft_sampling``); each
draft's distribution does not depend on the other drafts' values, so the probabilities passed to the
sampler are exactly those the drafts were drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.proposers.contract import DraftInputs, DraftOutput, empty_drafts
from spec_backend.proposers.draft_sampling import DraftChain
from spec_backend.proposers.dynamic_tree import Grower
from spec_backend.proposers.head_cache import HeadCacheDrafter
from spec_backend.proposers.sibling_draws import sampled_siblings, static_tree_output
from spec_backend.proposers.tree_build import depths_of, fill_static_batch
from spec_backend.step import HiddenStateRequest

if TYPE_CHECKING:
    from spec_backend.models.dflash import DFlashHead, DFlashSpec
    from spec_backend.proposers.contract import DrafterContext


class DFlashDrafter(HeadCacheDrafter):
    """See the module docstring."""

    def __init__(
        self, head: DFlashHead, spec: DFlashSpec, k: int, max_model_len: int, probabilistic: bool
    ) -> None:
        hidden = HiddenStateRequest(aux_layer_ids=spec.aux_layer_ids)
        super().__init__(head.config, next(head.parameters()), hidden, k, max_model_len, probabilistic)
        self.head, self.spec = head, spec

    def _context(self, inputs: DraftInputs, features: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """This step's committed rows' features ``[B, C, F]`` and their counts."""
        loc = inputs.batch.query_start_loc_host
        accepted = inputs.accepted
        lens = [
            loc[b + 1] - loc[b] if accepted.is_prefill else accepted.num_accepted[b] + 1
            for b in range(len(inputs.requests))
        ]
        rows = features.new_zeros((len(lens), max(1, *lens), features.shape[1]))  # [B, C, F]
        for b, n in enumerate(lens):
            rows[b, :n] = features[loc[b] : loc[b] + n]
        return rows, lens

    def _block(
        self, inputs: DraftInputs, rows: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ids ``[B, rows]`` = [last committed token, MASK × (rows - 1)] and their positions."""
        requests = inputs.requests
        last = [r.output_token_ids[-1] if r.output_token_ids else r.prompt_token_ids[-1] for r in requests]
        ids = torch.full((len(requests), rows), self.spec.mask_token_id, dtype=torch.int64)
        ids[:, 0] = torch.tensor(last, dtype=torch.int64)
        first = torch.tensor([r.num_tokens - 1 for r in requests], dtype=torch.int64)
        positions = first[:, None] + torch.arange(rows)[None]
        return ids.to(device), positions.to(device)

    def block_rows(self) -> int:
        """Rows of the block this drafter runs: the anchor and one mask per draft."""
        return self.num_speculative_tokens + 1

    def run_block(self, inputs: DraftInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's committed rows into the draft cache and run the block: its rows' normed
        outputs ``[B, rows, H]`` and ids ``[B, rows]``."""
        features = self.features(inputs)  # [N, n·Ht]
        self.rollback(inputs)
        rows, lens = self._context(inputs, features)
        start, cache = inputs.batch.start, self._cache()
        tokens = torch.zeros(rows.shape[:2], dtype=torch.int64, device=rows.device)  # [B, C] (unused ids)
        batch = self.step_batch(start, tokens, lens)
        block_ids, block_positions = self._block(inputs, self.block_rows(), rows.device)
        cache.begin_step(batch)
        try:
            hidden = self.head(
                rows[:, : batch.max_query_len],
                batch.padded_positions(),
                block_ids,
                block_positions,
                cache,
                batch.seq_lens,
            )  # [B, rows, H]
        finally:
            cache.end_step()
        self.mark_committed(inputs, lens)
        return hidden, block_ids

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        out, block_ids = self.run_block(inputs)
        hidden = out[:, 1:]  # [B, K, H] the draft rows
        k_max = max(inputs.budgets, default=0)
        if k_max == 0:
            return empty_drafts(len(inputs.requests), self.num_speculative_tokens, out.device)
        chain = DraftChain(inputs.requests, self.probabilistic, out.device)
        logits = self.head.logits(hidden[:, :k_max])  # [B, k_max, V]
        selector = self.head.candidate_selector
        if selector is None:
            for i in range(k_max):
                chain.draw(logits[:, i])
            return chain.output(inputs.budgets)
        unary, ids, projected = selector.candidates(hidden[:, :k_max], logits)  # DFlash2
        previous = block_ids[:, 0]  # [B] the anchor
        for i in range(k_max):  # left to right: each choice is the next position's predecessor
            scores = selector.scores(unary[:, i], ids[:, i], projected[:, i], previous, logits.shape[-1])
            previous = chain.draw(scores)  # [B]
        return chain.output(inputs.budgets)

    @torch.inference_mode()
    def propose_tree(self, inputs: DraftInputs, parents: Sequence[int], ranks: Sequence[int]) -> DraftOutput:
        """A static tree from the block's rows: a node at depth ``d`` takes its rank among the tokens of
        row ``d``'s distribution (rows do not depend on the drafts before them; DFlash2's selector is a
        chain rule and is not used here)."""
        out = self.run_block(inputs)[0]  # [B, K+1, H]
        logits = self.head.logits(out[:, 1:])  # [B, K, V] row d-1 drafts depth d
        depths = depths_of(parents)
        siblings = sampled_siblings(inputs.requests, self.probabilistic)

        def row_of(parent: int, _: Sequence[torch.Tensor]) -> torch.Tensor:  # [B, V]
            return logits[:, depths[parent] if parent >= 0 else 0]

        tokens = fill_static_batch(parents, ranks, row_of, siblings)
        return static_tree_output(tokens, parents, ranks, siblings)

    @torch.inference_mode()
    def grower(self, inputs: DraftInputs) -> Grower:
        """EAGLE-2's rule over the block (DDTree-style) and multi-path drafts: a node at depth ``d`` gives
        its children row ``d``'s distribution (rows do not depend on the drafts before them), so a level
        feeds nothing: its outputs are the rows of the fed nodes' depths."""
        rows = self.run_block(inputs)[0][:, 1:]  # [B, K, H] row d drafts depth d + 1

        def forward(
            columns: Sequence[Sequence[int]], ids: torch.Tensor, hidden: torch.Tensor
        ) -> torch.Tensor:
            width = ids.shape[1]
            depths = [depths_of(c) + [1] * (width - len(c)) for c in columns]  # padding: any row
            index = torch.tensor(depths, device=rows.device)  # [B, Q] a node at depth d outputs row d
            return rows.gather(1, index[..., None].expand(-1, -1, rows.shape[-1]))  # [B, Q, H]

        def log_probs(out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
            return torch.log_softmax(self.head.logits(out).float(), dim=-1)

        return Grower(rows[:, 0], forward, log_probs)


def build_dflash_drafter(ctx: DrafterContext) -> DFlashDrafter:
    """Load ``speculative_config.model`` (z-lab DFlash format) for the target."""
    from spec_backend.models.dflash import load_dflash_head

    config, model = ctx.config, ctx.model_path("a DFlash checkpoint folder")
    target: Any = ctx.target
    head, spec = load_dflash_head(model, target, str(target.config._attn_implementation), target.dtype)
    if ctx.prepare is not None:
        ctx.prepare(head)
    assert config.num_speculative_tokens is not None
    if config.num_speculative_tokens > spec.block_size - 1:
        raise ValueError(
            f"num_speculative_tokens={config.num_speculative_tokens} exceeds what the DFlash checkpoint "
            f"{model!r} drafts per block (block_size {spec.block_size} - 1 = {spec.block_size - 1})"
        )
    return DFlashDrafter(
        head, spec, config.num_speculative_tokens, ctx.max_model_len, config.uses_draft_probs
    )


__all__ = ["DFlashDrafter", "build_dflash_drafter"]
