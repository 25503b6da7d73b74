"""Public conformance suite for rejection-sampler backends.

Every backend runs it against its own sampler ops::

    from spec_backend.testing import run_conformance

    report = run_conformance("reference")  # or a Backend instance
    print(report.summary())
    report.assert_passed()

``python -m spec_backend.testing --backend NAME`` does the same from the shell, and
``python -m spec_backend.testing --table`` prints the exact deviation / acceptance table quoted in
docs/sampling.md. Pytest-friendly pieces: ``exact_checks()``, ``check_sampler(sampler)``, the
``properties.check_*`` functions and ``CheckResult.check()`` (raises ``ConformanceError``).

What is public: the names below (``__all__``) and the conformance modules that define and check them.
``spec_backend.testing.fixtures`` is not: it holds the repository's own test fixtures (random draft
checkpoints in the published formats, tiny GGUF Q4_1 / Q8_0 round-trip models), which change with the
tests that use them.
"""

from __future__ import annotations

from spec_backend.testing.conformance import (
    MODES,
    build_sampler,
    check_lossless_label,
    check_monte_carlo,
    check_sampler,
    monte_carlo,
    property_checks,
    rule_of,
    run_conformance,
)
from spec_backend.testing.exact_checks import deviation_table, exact_checks
from spec_backend.testing.report import CheckResult, ConformanceError, ConformanceReport

__all__ = [
    "MODES",
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "build_sampler",
    "check_lossless_label",
    "check_monte_carlo",
    "check_sampler",
    "deviation_table",
    "exact_checks",
    "monte_carlo",
    "property_checks",
    "rule_of",
    "run_conformance",
]
