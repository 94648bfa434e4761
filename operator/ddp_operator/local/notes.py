"""What ``ddpjob local`` says once at its start: what runs differently here than in a cluster (the pods
share one folder, no API server reads the Secrets, no init container runs), with what ``ddpjob validate``
warns of for a cluster. Pure; :mod:`.run` prints them."""

from __future__ import annotations

from pathlib import Path

from ddp_operator.api.spec import Spec, sync_hook
from ddp_operator.api.spec_warnings import lost_checkpoints, not_elastic, warnings
from ddp_operator.children import render
from ddp_operator.local import processes, validation
from ddp_operator.observe import references
from ddp_trainer import contract


def local_notes(spec: Spec, first_attempt: int, run_dir: Path, pod_security: str | None = None) -> list[str]:
    """What runs differently here than in a cluster, said once at the start; with what ``ddpjob validate``
    warns of for a cluster (``pod_security``: for that Pod Security level too)."""
    notes = []
    dirs = processes.volume_dirs(render.render_job(spec, first_attempt), run_dir)
    if moved := processes.command_dir(spec.working_dir, dirs, Path.cwd())[1]:
        notes.append(moved)
    if spec.command is None and spec.args is not None:
        notes.append(
            "no spec.command: the args run after the trainer image's entrypoint "
            "(torchrun, under the launcher), " + " ".join(contract.IMAGE_ENTRYPOINT)
        )
    if reason := not_elastic(spec):
        notes.append(reason)
    # what `ddpjob validate` warns of, for a cluster: here some of it differs (the pods share one folder)
    for warning in warnings(spec):
        if warning == reason:
            continue
        here = (
            " (here the pods share one folder, so a restart resumes all the same: a cluster would not)"
            if warning == lost_checkpoints(spec)
            else ""
        )
        notes.append(f"in a cluster (`ddpjob validate` warns): {warning}{here}")
    for refused in validation.pod_security(spec, pod_security):
        notes.append(
            f"in a cluster (`ddpjob validate --pod-security {pod_security}` warns): {refused} (a namespace "
            f"enforcing {pod_security} would refuse the pods; here nothing does)"
        )
    # named as the operator names them when they are missing (observe.references): kind, name, field
    named = references.references(spec)
    if env_from := [str(ref) for ref in named if ref.field.startswith("spec.envFrom")]:
        notes.append(
            f"{', '.join(env_from)}: not read here (no API server); this machine's environment reaches "
            "every pod, so export their variables before `ddpjob local`"
        )
    if s3 := [str(ref) for ref in named if ref.field.startswith("spec.checkpoint.s3")]:
        notes.append(
            f"{s3[0]}: not read here (no API server); export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "before `ddpjob local`"
        )
    if spec.pod_template.init_containers:
        names = ", ".join(str(c.get("name")) for c in spec.pod_template.init_containers)
        notes.append(
            f"spec.podTemplate.initContainers ({names}): not run here; only the trainer container runs"
        )
    if sync_hook(spec):
        notes.append(
            "spec.syncCheck.autoInstrument: the sync hook's init container copies ddp_trainer from this "
            f"Python environment into the pods' {contract.SYNC_HOOK_DIR} volume, first on their PYTHONPATH"
        )
    if first_attempt > contract.FIRST_ATTEMPT:
        notes.append(
            f"attempts continue at {first_attempt}: the earlier run's logs stay in its attempt-N folders "
            "(and its attempts do not count against maxRestarts)"
        )
    return notes
