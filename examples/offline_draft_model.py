"""Speculative decoding with a separate draft model, in vLLM's offline-API shape.

    python examples/offline_draft_model.py                      # the bundled SmolLM2 drafting for itself
    python examples/offline_draft_model.py --draft /path/to/small-model --k 4

The draft must share the target's tokenizer. Greedy output is the target's own greedy output, token for
token; the speed-up depends on how often the draft agrees with the target (printed as acceptance).
"""

from __future__ import annotations

import argparse

from spec_backend import LLM, SamplingParams


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="target: a folder, a .gguf file or 'smollm2'")
    parser.add_argument("--draft", default="smollm2", help="draft model: a folder, a .gguf file or 'smollm2'")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    llm = LLM(
        model=args.model,
        speculative_config={"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k},
    )
    prompts = ["Write a Python function that adds two numbers.", "What is speculative decoding?"]
    outputs = llm.generate(
        [llm.chat_prompt(p) for p in prompts], SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    )
    texts = []
    for prompt, output in zip(prompts, outputs, strict=True):
        completion = output.outputs[0]
        texts.append(completion.text)
        print(f"Prompt: {prompt!r}\nGenerated: {completion.text!r}")
        print(f"  drafted {output.num_draft_tokens}, accepted {output.num_accepted_tokens}")
    total = llm.metrics.total
    if total.num_drafts:
        print(f"acceptance length: {1 + total.num_accepted_tokens / total.num_drafts:.2f} tokens per step")
    return texts


if __name__ == "__main__":
    main()
