"""The rejection sampler's triton kernels, shared by the CUDA and Ascend backends, and ``TritonSamplerOps``
(``ops``), the ``SamplerOps`` implementation that launches them.

Nothing is imported here: every module of this package imports triton, and triton must be imported only
after ``TRITON_INTERPRET`` is set (the tests run the kernels in the interpreter on CPU). The backends
import ``spec_backend.sampling.triton.ops`` lazily, in ``sampler_ops()``, so ``import spec_backend``
never imports triton.
"""
