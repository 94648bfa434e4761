"""What ``ddpjob validate`` warns of beside ``spec.warnings``
(:func:`ddp_operator.api.spec_warnings.warnings`), each worded once here: a script ``ddpjob local`` would not
find, and what a namespace enforcing a Pod Security level would refuse in the pods. ``ddpjob validate`` prints
them; ``ddpjob local`` repeats the Pod Security ones at its start, for the level its own ``--pod-security``
names (a missing script it refuses outright, before any pod starts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ddp_operator.api import pod_security_standards
from ddp_operator.api.spec import Spec
from ddp_operator.children import render
from ddp_operator.local import scripts

POD_SECURITY_HELP = (
    "also warn about what a namespace enforcing this Pod Security level would refuse in the pods "
    "(pod-security.kubernetes.io/enforce), naming each field"
)
"""The ``--pod-security`` flag's help, the same for ``validate`` and ``local``."""


def pod_security(spec: Spec, level: str | None) -> list[str]:
    """What Pod Security admission at ``level`` would refuse in the pods (none when no level is asked)."""
    if level is None:
        return []
    pod = render.render_job(spec, 1)["spec"]["template"]["spec"]
    return pod_security_standards.violations(pod, level)


def script_warnings(spec: Spec, dirs: Sequence[Path]) -> list[str]:
    """Scripts ``ddpjob local`` would not find in ``dirs`` (a warning: in a cluster the script is in the
    image)."""
    return [
        f"{line}: `ddpjob local` would not find it (in a cluster it must be in the image)"
        for line in scripts.missing(spec, dirs)
    ]
