"""End-to-end benchmark: the engine (with and without n-gram speculation) against transformers' generate.

Same code as ``spec-backend bench e2e``; run ``python benchmarks/bench_e2e.py --help`` for options.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from spec_backend.tools.cli import add_e2e_args, cmd_bench_e2e

    parser = argparse.ArgumentParser(description=__doc__)
    add_e2e_args(parser)
    return cmd_bench_e2e(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
