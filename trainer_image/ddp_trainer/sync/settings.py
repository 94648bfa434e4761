"""The settings of :class:`ddp_trainer.sync.SyncHealth`: :class:`SyncConfig` (public as
``ddp_trainer.sync.SyncConfig`` and ``SyncHealth.Config``), whose :meth:`SyncConfig.from_env` takes each
setting from the argument, else the DDPJob's environment, else the default; a refusal
(:class:`SyncHealthError`) names the argument or the variable, the value and what is accepted. No torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from ddp_trainer import contract
from ddp_trainer.core.config import Policy

DEFAULT_EVERY = 100
DEFAULT_POLICY: Policy = "Fail"
POLICIES: tuple[str, ...] = get_args(Policy)
DEFAULT_PEER_TIMEOUT = 30.0
"""Seconds a check waits for its peers to join it (after the first): DDP keeps ranks within one step of
each other, so a peer that is not there by then never comes."""
DEFAULT_PROBE_EVERY = 1000
"""Steps between probes. One probe costs about one step with gradients (bench/probe_bench.py): every
1000 steps it is ~0.1 % of training, the issue's budget, and a fault is found within 1000 steps."""
PROBE_POLICIES = ("Fail", "Warn")


class SyncHealthError(RuntimeError):
    """Bad input, or ranks that do not check together: the check cannot run (training is left as it was)."""


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


@dataclass(frozen=True)
class _FromEnv:
    """How one setting the DDPJob also sets is read and checked."""

    variable: str
    default: Any
    accept: Callable[[Any], bool]
    expected: str

    def resolve(self, env: Mapping[str, str], given: Any, name: str) -> Any:
        return setting(env, given, name, self.variable, self.default, self.accept, self.expected)


_FROM_ENV: dict[str, _FromEnv] = {
    "every": _FromEnv(
        contract.SYNC_EVERY_ENV, DEFAULT_EVERY, whole_steps(1), "expected a whole number of steps, at least 1"
    ),
    "on_divergence": _FromEnv(
        contract.ON_DIVERGENCE_ENV,
        DEFAULT_POLICY,
        POLICIES.__contains__,
        f"expected one of {', '.join(POLICIES)}",
    ),
    "probe_every": _FromEnv(
        contract.PROBE_EVERY_ENV,
        DEFAULT_PROBE_EVERY,
        whole_steps(0),
        "expected a whole number of steps, 0 for off",
    ),
    "on_faulty_rank": _FromEnv(
        contract.ON_FAULTY_RANK_ENV,
        PROBE_POLICIES[0],
        PROBE_POLICIES.__contains__,
        f"expected one of {', '.join(PROBE_POLICIES)}",
    ),
}
"""The settings a DDPJob sets for every pod (``spec.syncCheck``), in the order they are checked."""


def _check_total(total_steps: Any) -> None:
    if total_steps is not None and (isinstance(total_steps, bool) or total_steps < 1):
        raise SyncHealthError(f"total_steps={total_steps!r}: expected a positive number of steps, or None")


@dataclass(frozen=True)
class SyncConfig:
    """What :class:`ddp_trainer.sync.SyncHealth` does, as plain values (the objects it works with, the
    model, the optimizer, a scaler, a process group, are its own arguments).

    ``SyncConfig(...)`` is exactly the values given, the defaults for the rest; :meth:`from_env` fills
    what is not given from the DDPJob's environment first, as ``SyncHealth`` does when it gets no config.
    Either refuses a bad value with :class:`SyncHealthError` naming it and what is accepted."""

    every: int = DEFAULT_EVERY
    """Steps between checks (at least 1); the DDPJob's ``spec.syncCheck.everySteps``
    (``DDPJOB_SYNC_EVERY``)."""
    on_divergence: Policy = DEFAULT_POLICY
    """``Fail`` (the report, then exit :data:`ddp_trainer.contract.DIVERGENCE_EXIT_CODE`), ``Repair``
    (copy rank 0's state to every rank) or ``Warn``; ``DDPJOB_ON_DIVERGENCE``."""
    total_steps: int | None = None
    """The run's last step (a check there, and the report's total); None: unknown."""
    start_step: int = 0
    """The step a resumed loop starts from (ignored when ``SyncHealth`` is given a ``state``)."""
    probe_every: int = DEFAULT_PROBE_EVERY
    """Steps between compute probes (:mod:`ddp_trainer.sync.probe`), 0 for off; ``DDPJOB_PROBE_EVERY``."""
    on_faulty_rank: str = PROBE_POLICIES[0]
    """``Fail`` (the report, then exit :data:`ddp_trainer.contract.FAULTY_RANK_EXIT_CODE`) or ``Warn``
    when a probe names a faulty rank; ``DDPJOB_ON_FAULTY_RANK``."""
    peer_timeout: float = DEFAULT_PEER_TIMEOUT
    """Seconds a check (after the first) waits for its peers before it fails naming the cause."""
    broadcast_buffers: bool | None = None
    """Whether DDP copies rank 0's buffers at each forward (then the check copies them first); None: what
    the DDP wrapper says, False for a plain module."""
    check_buffers: bool = True
    """False: compare parameters, optimizer and control state only, for buffers meant to differ between
    ranks (DDP with ``broadcast_buffers=False``)."""
    initial_check: bool = True
    """Check when built; False: the caller runs the first check when it wants."""
    write_report: bool = True
    """Write the termination report at the end; False: the caller writes it."""

    def __post_init__(self) -> None:
        _check_total(self.total_steps)
        for name, rule in _FROM_ENV.items():
            value = getattr(self, name)
            if not rule.accept(value):
                raise SyncHealthError(f"{name}={value!r}: {rule.expected}")
        object.__setattr__(self, "peer_timeout", float(self.peer_timeout))

    @classmethod
    def names(cls) -> frozenset[str]:
        """The settings' names (the keyword arguments :meth:`from_env` and ``SyncHealth`` take for them)."""
        return frozenset(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **settings: Any) -> SyncConfig:
        """The settings given (None: not given), else the DDPJob's environment (``env``, default
        ``os.environ``) for those it sets, else the defaults. Raises :class:`SyncHealthError` naming the
        argument or the variable, the value and what is accepted; ``TypeError`` for an unknown name."""
        unknown = sorted(settings.keys() - cls.names())
        if unknown:
            raise TypeError(f"SyncConfig.from_env() got an unexpected keyword argument {unknown[0]!r}")
        environ: Mapping[str, str] = os.environ if env is None else env
        _check_total(settings.get("total_steps"))
        given = {name: value for name, value in settings.items() if value is not None}
        try:
            for name, rule in _FROM_ENV.items():
                given[name] = rule.resolve(environ, settings.get(name), name)
        except ValueError as err:
            raise SyncHealthError(str(err)) from None
        return cls(**given)

    def replace(self, **settings: Any) -> SyncConfig:
        """This config with the settings given (None: not given) in place of its own; checked again."""
        unknown = sorted(settings.keys() - self.names())
        if unknown:
            raise TypeError(f"SyncConfig.replace() got an unexpected keyword argument {unknown[0]!r}")
        return dataclasses.replace(self, **{k: v for k, v in settings.items() if v is not None})


def deprecated_settings(settings: Mapping[str, Any], with_config: bool) -> str:
    """The warning for settings given as keywords of ``SyncHealth``, naming the one config that says the
    same: ``SyncHealth.Config.from_env(...)`` (what ``SyncHealth`` builds from them), or, beside a config,
    that config's ``replace(...)``."""
    given = ", ".join(f"{name}=..." for name in sorted(settings))
    if with_config:
        return (
            f"SyncHealth(model, optimizer, config, {given}) is deprecated: pass "
            f"SyncHealth(model, optimizer, config.replace({given})) (docs/your-code.md)"
        )
    return (
        f"SyncHealth(model, optimizer, {given}) is deprecated: pass the settings as one config, "
        f"SyncHealth(model, optimizer, SyncHealth.Config.from_env({given})) (docs/your-code.md)"
    )
