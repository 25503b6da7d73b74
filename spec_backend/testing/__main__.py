"""``python -m spec_backend.testing``: run the conformance suite, or print the exact numbers for the docs."""

from __future__ import annotations

import argparse
import sys

from spec_backend.testing.cases import paper_case
from spec_backend.testing.exact import expected_accepted
from spec_backend.testing.exact_checks import VERIFY_RULES, argmax_first_rate, deviation_table


def print_table() -> None:
    """Markdown tables: TV to the target per case and rule, and expected tokens per step."""
    rows = deviation_table()
    print("| case | rule | TV first token | TV first K+1 tokens | E[tokens/step] |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['rule']} | {r['tv_first']:.3g} | {r['tv_all']:.3g} | "
            f"{r['tokens_per_step']:.4f} |"
        )
    case = paper_case()
    print(
        f"\npaper example: E[accepted] standard = {expected_accepted(case, 'standard') * 9:.6f}/9, "
        f"block-lossless = {expected_accepted(case, 'block-lossless') * 9:.6f}/9"
    )
    for rule in VERIFY_RULES:  # the registry's rules that verify drafts against the target
        print(f"issue example, K=3, P(first token = argmax) under {rule}: {argmax_first_rate(rule):.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec_backend.testing", description=__doc__)
    parser.add_argument("--backend", default=None, help="backend name (default: load_backend())")
    parser.add_argument("--samples", type=int, default=20000, help="requests per Monte-Carlo group")
    parser.add_argument("--table", action="store_true", help="print the exact deviation table and exit")
    args = parser.parse_args(argv)
    if args.table:
        print_table()
        return 0
    from spec_backend.testing.conformance import run_conformance

    report = run_conformance(args.backend, samples=args.samples)
    print(report.summary())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
