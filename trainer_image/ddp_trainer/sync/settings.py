"""The settings :class:`ddp_trainer.sync.SyncHealth` reads (the check's interval and policy, the probe's):
an argument, else the DDPJob's environment, else a default; a refusal names the argument or the variable,
the value and what is accepted. Standard library only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def setting(
    env: Mapping[str, str],
    given: Any,
    name: str,
    variable: str,
    default: Any,
    accept: Callable[[Any], bool],
    expected: str,
) -> Any:
    """One setting of :class:`ddp_trainer.sync.SyncHealth` (the check's interval and policy, the probe's):
    the argument ``name`` when given, else the DDPJob's environment ``variable`` (read as a whole number
    when ``default`` is one), else ``default``. Raises ``ValueError`` naming the argument or the variable,
    the value and what is ``expected`` when ``accept`` refuses it."""
    source = name
    if given is None:
        source = variable
        raw = env.get(variable, "").strip()
        given = raw or default
        if raw and isinstance(default, int):
            try:
                given = int(raw)
            except ValueError:
                raise ValueError(f"{source}={raw!r}: {expected}") from None
    if not accept(given):
        raise ValueError(f"{source}={given!r}: {expected}")
    return given


def whole_steps(minimum: int) -> Callable[[Any], bool]:
    """Accepts an int (not a bool) of at least ``minimum``."""
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum
