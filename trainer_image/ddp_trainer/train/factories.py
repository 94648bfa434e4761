"""Resolve ``--model`` / ``--dataset`` values: a built-in name or a user factory ``package.module:function``.

A user factory is any importable callable taking the :class:`~ddp_trainer.core.config.TrainerConfig`::

    # my_project/models.py, installed in the image or on PYTHONPATH
    def build(config):            # --model=my_project.models:build
        return torch.nn.Sequential(...)

It runs on every rank after the model seed is set, so every rank builds the same initial weights
(and the trainer verifies that before step 1 anyway).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve(spec: str, builtins: Mapping[str, Callable[..., Any]], what: str) -> Callable[..., Any]:
    """The factory named by ``spec``; the error lists what would be accepted."""
    if spec in builtins:
        return builtins[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(builtins))
        raise ValueError(
            f"--{what}={spec!r}: expected a built-in name ({known}) or 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--{what}={spec!r}: cannot import {module_name!r}: {err}") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--{what}={spec!r}: {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]
