"""Cost of reading target hidden states: forward hooks (the engine's way) against ``output_hidden_states``.

One transformers forward of the bundled SmolLM2 (float32) over ``--tokens`` tokens (a prefill) and over
5 tokens (a verify-sized step), four ways, interleaved, median of ``--repeats``:

* plain (logits only);
* the engine's ``HiddenCapture`` hooks on EAGLE-3's default aux layers (2, L/2, L-3) and the final norm;
* ``output_hidden_states=[2, L/2, L-3]`` (transformers keeps only the selected indices);
* ``output_hidden_states=True`` (all L+1 states).

Run: ``python benchmarks/bench_hidden_capture.py --threads 2``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any


def _time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from spec_backend.runtime.hidden import HiddenCapture
    from spec_backend.runtime.sources import resolve_model
    from spec_backend.step import HiddenStateRequest

    torch.set_num_threads(args.threads)
    source = resolve_model("smollm2")
    plain = AutoModelForCausalLM.from_pretrained(source.directory, gguf_file=source.gguf_file).eval()
    hooked = AutoModelForCausalLM.from_pretrained(source.directory, gguf_file=source.gguf_file).eval()
    layers = plain.config.num_hidden_layers
    ids = (2, layers // 2, layers - 3)
    HiddenCapture(hooked, HiddenStateRequest(final=True, aux_layer_ids=ids), layers)
    print(f"SmolLM2 ({layers} layers), aux ids {ids}; median ms per forward of {args.repeats}")
    print(
        "| tokens | plain | hooks (3 aux + final) | output_hidden_states=[ids] | output_hidden_states=True |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in (args.tokens, 5):
        x = torch.randint(0, plain.config.vocab_size, (1, n))
        runs = {
            "plain": lambda x=x: plain(x),
            "hooks": lambda x=x: hooked(x),
            "selected": lambda x=x: plain(x, output_hidden_states=list(ids)),
            "all": lambda x=x: plain(x, output_hidden_states=True),
        }
        with torch.inference_mode():
            for fn in runs.values():
                fn()  # warm-up
            ms = {name: _time(fn, args.repeats) for name, fn in runs.items()}
        print(f"| {n} | {ms['plain']:.1f} | {ms['hooks']:.1f} | {ms['selected']:.1f} | {ms['all']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
