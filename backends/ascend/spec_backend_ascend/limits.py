"""Ascend device limits: the fused-attention layouts' caps and the ACLGraph stream budget.

Pure constants and arithmetic: importing this module never touches ``torch_npu``. Every rule names its
source (the op's documentation in Ascend/op-plugin, vllm-ascend's code or issues) so it can be
re-checked against a new CANN release; docs/ascend.md lists them.
"""

from __future__ import annotations

#: npu_fused_infer_attention_score's TND decode path handles at most 16 query tokens per request, so
#: verification (K draft tokens + 1 bonus position) needs K+1 <= 16. Source: vllm-ascend
#: attention_v1.py, "decode_threshold exceeded npu_fused_infer_attention_score TND layout's limit of 16".
MAX_QUERY_TOKENS_PER_REQUEST = 16
#: Head dims the TND layout accepts (q, k and v equal). Source: CANN's check quoted in vllm-ascend PR #9632
#: (error 561002, "When layout is TND, queryD, keyD and valueD must be same equal 192/128/64, or queryD
#: and keyD equal 192 and valueD equal 128"); older CANN accepted 192 only (vllm-ascend issue #8045).
#: Other head dims take the BNSD layout.
TND_HEAD_DIMS = (64, 128, 192)
#: Head dims every other layout accepts: at most 512, a multiple of 16 for float16/bfloat16.
#: Source: op-plugin docs torch_npu-npu_fused_infer_attention_score.md, "D: <= 512, 16-byte aligned".
MAX_HEAD_DIM = 512
HEAD_DIM_ALIGN = 16
#: k range npu_top_k_top_p documents (op-plugin docs torch_npu-npu_top_k_top_p.md: "[1, 1024]"); larger k
#: (or a row with top-k off, which vLLM passes as k = V) takes the torch filter.
TOP_K_MAX = 1024
#: Hardware streams captured graphs may use on one device: 2048 minus 248 kept spare (the constant of
#: vllm-ascend's update_aclgraph_sizes, vllm_ascend/utils.py, removed in PR #9962). A heuristic: CANN
#: documents no per-graph stream cost, and newer HDK/CANN stacks capture many more graphs.
GRAPH_STREAM_BUDGET = 1800
#: Streams one whole-forward (FULL) graph is assumed to take: vllm-ascend's old rule charged one stream
#: per full graph (the FULL_AND_PIECEWISE branch of update_aclgraph_sizes); a heuristic. Our graphs are
#: whole forwards (target verify step, draft step), never per-layer pieces.
STREAMS_PER_GRAPH = 1
#: Largest capture size in tokens. Source: vLLM's default max_cudagraph_capture_size (512), which
#: vllm-ascend keeps for ACLGraph.
MAX_CAPTURE_SIZE = 512
#: KV positions per page when the engine's padded cache is presented to the op as a paged cache.
#: Source: op-plugin docs torch_npu-npu_fused_infer_attention_score.md (page attention: block_size a
#: multiple of 128 in [128, 512]); vllm-ascend's get_supported_kernel_block_sizes() is [128].
PAGE_BLOCK_SIZE = 128
#: Side of the compressed causal mask that sparse_mode 2/3/4 require (a fixed 2048 x 2048 matrix).
#: Source: the same op document (sparse_mode 2/3/4 take the optimised 2048 x 2048 atten_mask).
SPARSE_MASK_SIZE = 2048
#: sparse_mode 3: "rightDownCausal", causal aligned to the bottom-right corner of each request's
#: (query length x kv length) block — query i of a request sees keys at positions <= kv - q + i.
#: Source: the same op document (sparse_mode table); vllm-ascend passes 3 for causal attention.
SPARSE_MODE_RIGHT_DOWN_CAUSAL = 3
#: sparse_mode 4: "band", the keys from ``pre_tokens`` before to ``next_tokens`` after each query's
#: diagonal, origin at the bottom-right corner like mode 3, with the same compressed mask; a sliding window
#: of W positions is ``pre_tokens = W - 1, next_tokens = 0``. The op ignores sparse_mode, pre_tokens and
#: next_tokens when the query's S is 1, and TND takes modes 0 and 3 only. Source: op-plugin docs
#: torch_npu-npu_fused_infer_attention_score.md (sparse_mode, pre_tokens, TND constraints) and its
#: sparse_mode page ("sparseMode为4时，代表band场景 ... 参数起点为右下角").
SPARSE_MODE_BAND = 4


class StreamLedger:
    """The stream budget shared by every graph runner of one backend (target and drafter runners alike).

    A runner reserves streams for the sizes it will capture when it is built; what is left bounds the
    next runner. A heuristic guard: a capture that still fails for lack of streams (error 207008) is
    reported with what to lower (``AclGraphDriver``).
    """

    def __init__(self, total: int = GRAPH_STREAM_BUDGET, per_graph: int = STREAMS_PER_GRAPH) -> None:
        if total < 0 or per_graph < 1:
            raise ValueError(f"need total >= 0 and per_graph >= 1, got {total}, {per_graph}")
        self.total, self.per_graph, self.used = total, per_graph, 0

    @property
    def graphs_left(self) -> int:
        """How many more whole-forward graphs fit."""
        return (self.total - self.used) // self.per_graph

    def reserve(self, graphs: int) -> None:
        """Take the streams of ``graphs`` graphs; ``ValueError`` when they do not fit."""
        if graphs > self.graphs_left:
            raise ValueError(f"{graphs} graphs do not fit the {self.graphs_left} left in the stream budget")
        self.used += graphs * self.per_graph
