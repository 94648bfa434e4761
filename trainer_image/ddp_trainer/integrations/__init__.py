"""Sync health inside the frameworks users already train with, each one line in their script:

* :mod:`ddp_trainer.integrations.transformers` — ``SyncHealthCallback`` for the Hugging Face ``Trainer``;
* :mod:`ddp_trainer.integrations.lightning` — ``SyncHealthCallback`` for ``lightning.pytorch.Trainer``.

Both build a :class:`ddp_trainer.sync.health.SyncHealth` when training starts and call it after each optimizer
step. Each module imports its framework, so importing ``ddp_trainer`` never does: the frameworks are the
user's dependencies, not the trainer's.
"""

from __future__ import annotations

import logging

log = logging.getLogger("ddp_trainer")


def distributed() -> bool:
    """Whether a process group exists; a callback in a run without one (the same script run as plain
    ``python``) says once that there is nothing to compare, and stays out of the way."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return True
    log.warning(
        "sync health: no torch.distributed process group (not under torchrun?): no checks in this run"
    )
    return False


def version_tuple(version: str) -> tuple[int, int]:
    """``"4.57.1"`` → ``(4, 57)``; a version that does not parse counts as new enough."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return (10**6, 0)
    return major, minor


def require(package: str, version: str, minimum: tuple[int, int], what: str) -> None:
    """Raise ImportError naming ``package``, its ``version`` and the ``minimum`` when it is older."""
    if version_tuple(version) < minimum:
        raise ImportError(
            f"{what} needs {package} >= {minimum[0]}.{minimum[1]}; this is {package} {version} "
            f"(pip install '{package}>={minimum[0]}.{minimum[1]}')"
        )
