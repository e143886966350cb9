"""Errors a user can cause, in a leaf module every layer may import without a cycle."""

from __future__ import annotations


class SpecError(ValueError):
    """An invalid spec: every problem as ``(dotted.field, message)``; exit code 2."""

    exit_code = 2

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems, self.source = problems, source
        where = f" in {source}" if source else ""
        lines = [f"invalid spec{where}:"]
        lines += [f"  {path or '<root>'}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


def overran(what: str, timeout_s: float) -> TimeoutError:
    """The error of a call past ``resources.round_timeout_s``, naming the setting (every
    backend that bounds its calls raises this one)."""
    return TimeoutError(f"{what} took longer than resources.round_timeout_s={timeout_s:g} s; "
                        "raise it if rounds are this slow")
