"""What is valid but probably unintended in a DDPJob's ``Spec``, each naming the field and the fix:
restarts that would start from step 0, a checkpoint claim a default cluster cannot give, a sync hook that
cannot go in front of ``PYTHONPATH``, ``spec.trainer`` ignored, ``spec.elastic`` that will not resize.
Pure; ``ddpjob validate`` and ``ddpjob local`` print them."""

from __future__ import annotations

from ddp_operator.api.spec import Spec, checkpoints_durable, runs_launcher, sync_hook

OBJECT_STORAGE = "spec.checkpoint.s3 (object storage)"
"""The way around a cluster's volumes, offered by every fix that needs another kind of storage."""


def not_elastic(spec: Spec) -> str | None:
    """Why a job with ``spec.elastic`` will not resize (a ``command`` of the user's runs torchrun's own
    static rendezvous, not the launcher's elastic one), naming the field and the fix; None when it will."""
    if spec.elastic is None or runs_launcher(spec):
        return None
    return (
        f"spec.elastic: spec.command {list(spec.command or [])} runs torchrun's static rendezvous, not "
        "ddpjob's launcher, so this job does not resize: a lost or taken-away node fails the attempt and "
        "the whole gang restarts; leave spec.command out and put your script first in spec.args"
    )


def warnings(spec: Spec) -> list[str]:
    """What is valid but probably not what the author wants, each naming the field and the fix."""
    out = []
    custom = spec.command is not None or spec.args is not None
    if spec.sync_check.auto_instrument and custom and not sync_hook(spec):
        out.append(
            "spec.env PYTHONPATH: it comes from valueFrom, so the sync hook of spec.syncCheck.autoInstrument "
            "cannot be put in front of it and is off; give PYTHONPATH a value, or set autoInstrument: false "
            "to say so"
        )
    if lost := lost_checkpoints(spec):
        out.append(lost)
    if "trainer" in spec.given and (spec.command is not None or spec.args is not None):
        # spec.syncCheck is not ignored: it reaches any program as DDPJOB_SYNC_EVERY/DDPJOB_ON_DIVERGENCE,
        # which SyncHealth and its callbacks read (docs/your-code.md)
        out.append(
            "spec.trainer: ignored, because spec.command/spec.args run your own program instead of the "
            "built-in trainer, which alone reads it; remove it, or pass your program its settings in "
            "spec.args"
        )
    if reason := not_elastic(spec):
        out.append(reason)
    out.extend(storage_warnings(spec))
    return out


def lost_checkpoints(spec: Spec) -> str | None:
    """The warning for checkpoints that a gang restart would not find in a cluster (a pod-local emptyDir),
    or None. ``ddpjob local`` repeats it, saying why a restart there resumes all the same."""
    if spec.max_restarts == 0 or checkpoints_durable(spec):
        return None
    return (
        f"spec.checkpoint: checkpoints go to a pod-local emptyDir, so the {spec.max_restarts} gang "
        "restart(s) of spec.maxRestarts will start from step 0; give spec.checkpoint.volumeClaimTemplate "
        "(the operator creates a PersistentVolumeClaim), spec.checkpoint.volume or spec.checkpoint.s3"
    )


def storage_warnings(spec: Spec) -> list[str]:
    """A checkpoint claim a default cluster cannot give: the default StorageClasses of kind and minikube
    (local-path, hostpath) and of the clouds' block storage (EBS, Persistent Disk, Azure Disk) give only
    ReadWriteOnce, which pods on one node share (and a Multi-Attach error refuses a second node)."""
    claim = spec.checkpoint.claim if spec.checkpoint else None
    if claim is None:
        return []
    field, modes = "spec.checkpoint.volumeClaimTemplate", list(claim.access_modes)
    several = "a storageClassName whose class gives ReadWriteMany (NFS, EFS, Filestore, CephFS)"
    if "ReadWriteMany" in modes and claim.storage_class_name is None:
        instead = "accessModes [ReadWriteOnce]" if spec.nodes == 1 else several
        return [
            f"{field}.accessModes: {modes} from the cluster's default StorageClass, which on kind, minikube "
            "and the clouds' block storage gives only ReadWriteOnce (the claim would stay Pending); name "
            f"{instead}, or use {OBJECT_STORAGE}"
        ]
    if "ReadWriteOncePod" in modes and spec.nodes > 1:
        return [
            f"{field}.accessModes: {modes} lets one pod only mount the claim, but every one of the "
            f"{spec.nodes} pods mounts it; use [ReadWriteOnce] (pods on one node), {several}, or "
            f"{OBJECT_STORAGE}"
        ]
    if "ReadWriteMany" not in modes and spec.nodes > 1 and spec.device == "cuda":
        return [
            f"{field}.accessModes: {modes} lets the pods of one node only mount the claim, and these "
            f"{spec.nodes} pods with {spec.procs_per_node} GPU(s) each are likely on several nodes (the "
            f"others would fail with a Multi-Attach error); use {several}, or {OBJECT_STORAGE}"
        ]
    return []
