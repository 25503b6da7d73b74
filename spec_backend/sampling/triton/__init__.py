"""The rejection sampler's triton kernels, shared by the CUDA and Ascend backends, and ``TritonSamplerOps``,
the ``SamplerOps`` implementation that launches them. One module per role, from the bottom up:

* ``rng``: the counter-based random numbers (the hash of ``spec_backend.sampling.rng`` in uint32, the
  vocabulary uniforms of the residual race, the float64 acceptance uniforms);
* ``softmax``: the temperature softmax of logits rows and the row helpers every path shares with it;
* ``verify``: the accept/reject scans, the residual sampler (exponential race) and ``request_span``;
* ``greedy``: the row argmax and the greedy verification, alone or fused with the argmax;
* ``split``: the row-wide kernels with each row shared by several programs (``vocab_splits`` > 1);
* ``fused``: the verification without materialised target probabilities (``fused_verify``);
* ``rows`` (host side): the launches of the row-wide ops (softmax, residual sampling, fused verification),
  split or not;
* ``ops`` (host side): ``TritonSamplerOps``.

Nothing is imported here: every module of the package imports triton, which must be imported only after
``TRITON_INTERPRET`` is set (the tests run the kernels in the interpreter on CPU). The backends import
``spec_backend.sampling.triton.ops`` in ``sampler_ops()``, so ``import spec_backend`` never imports triton.

One source for every backend: tile sizes (``BLOCK_V`` = ``SamplerTuning.vocab_block``) are constexpr
arguments and grids are capped by ``SamplerTuning.max_grid``. Every kernel is *persistent-style*: program
``pid`` of ``nprog`` handles rows ``pid, pid + nprog, ...``, so any grid size >= 1 gives the same result.
No kernel reads anything back to the host, so the callers are graph-capturable.

Exactness conventions:

* the hash is the uint32 arithmetic of ``spec_backend.sampling.rng``, bit-exact (``tl.uint32``
  multiplications wrap, ``>>`` is logical);
* divisions use ``tl.math.div_rn`` (IEEE round-to-nearest; CUDA's default f32 ``/`` is approximate);
  launches pass ``enable_fp_fusion=False`` so that ``b * p - q`` is not contracted into an FMA, which
  would round differently from the torch reference;
* reductions (sums over the vocabulary) are blocked, so their float32 rounding may differ from torch's
  in the last bit: only the *sums* differ (the residual mass, the softmax normaliser), never a scan.

Conventions: N logits rows, V vocabulary, T drafts, B requests; ``tl.cast(row, tl.int64) * stride`` keeps
element offsets 64-bit (N * V exceeds 2^31 for large batches of 150k vocabularies).
"""
