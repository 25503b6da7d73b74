"""Results of conformance checks: one ``CheckResult`` per check, gathered in a ``ConformanceReport``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class ConformanceError(AssertionError):
    """A conformance check failed (an ``AssertionError``, so pytest shows it as a test failure)."""


@dataclass(frozen=True)
class CheckResult:
    """``name`` identifies the check (``tier/what[mode]``), ``detail`` carries the measured numbers."""

    name: str
    passed: bool
    detail: str = ""

    def check(self) -> CheckResult:
        """Raise ``ConformanceError`` when failed; return self otherwise (for pytest-style use)."""
        if not self.passed:
            raise ConformanceError(f"{self.name}: {self.detail}")
        return self

    def __str__(self) -> str:
        return f"[{'PASS' if self.passed else 'FAIL'}] {self.name}: {self.detail}"


@dataclass
class ConformanceReport:
    """All checks run against one backend."""

    backend: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def add(self, result: CheckResult) -> CheckResult:
        self.checks.append(result)
        return result

    def run(self, name: str, fn: Callable[[], CheckResult]) -> CheckResult:
        """Run one check; an exception inside it is recorded as a failure of that check."""
        try:
            result = fn()
        except Exception as exc:  # a crash is a conformance failure, not a suite failure
            result = CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")
        return self.add(result)

    def summary(self) -> str:
        lines = [
            f"conformance of backend {self.backend!r}: {len(self.checks) - len(self.failures())}"
            f"/{len(self.checks)} checks passed"
        ]
        lines.extend(str(c) for c in self.checks)
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Raise ``ConformanceError`` listing every failed check."""
        failed = self.failures()
        if failed:
            raise ConformanceError("\n".join(str(c) for c in failed))


__all__ = ["CheckResult", "ConformanceError", "ConformanceReport"]
