"""Exit codes of a trainer process, and the results they stand for.

torchrun collapses any failed child into its own exit status 1, so inside a pod the *termination message*
(see :mod:`ddp_trainer.report`) is the reliable signal; these codes are what each rank process returns,
which is what you see when a rank runs without torchrun or in torchrun's per-rank error summary.
"""

from __future__ import annotations

SUCCESS_EXIT_CODE = 0
"""Training finished. The report's ``verified`` says whether every sync check passed (under ``Warn`` a
job can finish with mismatches)."""

FAILURE_EXIT_CODE = 1
"""An error that is not a divergence: bad configuration, an exception in the model, a collective timeout."""

DIVERGENCE_EXIT_CODE = 86
"""The ranks stopped holding the same model and the policy was ``Fail`` (or a ``Repair`` did not take).
Reserved for divergence: nothing else in the trainer exits with 86."""

INTERRUPTED_EXIT_CODE = 143
"""SIGTERM (128 + 15): the trainer stopped at the next step boundary and saved a checkpoint. Non-zero on
purpose, so that a preempted pod is never counted as a finished one."""
