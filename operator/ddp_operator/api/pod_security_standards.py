"""Kubernetes Pod Security Standards, checked offline against the pod a DDPJob renders, each finding
naming the DDPJob field that causes it. Pure.

Where a namespace is labelled ``pod-security.kubernetes.io/enforce: baseline`` (or ``restricted``), the API
server's PodSecurity admission refuses each pod that breaks the level: the Job is created, its pods never
are, and the Job controller says so only in ``FailedCreate`` events. ``ddpjob validate --pod-security
LEVEL`` says it before anything is applied (:func:`violations`), and the operator names the fields when the
API server has refused the pods (:mod:`ddp_operator.observe.refused_pods`).

The checks follow the standards' published controls (kubernetes.io/docs/concepts/security/
pod-security-standards), those a DDPJob's fields can break: host namespaces, privileged containers, added
capabilities, hostPath volumes and host ports (``baseline``); volume types, privilege escalation, running as
root, the seccomp profile and dropping every capability (``restricted``). What ddpjob renders itself passes
``restricted``: non-root (uid 1000), seccomp RuntimeDefault, no privilege escalation, all capabilities
dropped; the sync hook's init container the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ddp_operator.api import names

LEVELS = ("privileged", "baseline", "restricted")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
TRAINER = "spec.podTemplate.containerSecurityContext"
POD = "spec.podTemplate.securityContext"


def level_at_least(level: str, floor: str) -> bool:
    return LEVELS.index(level) >= LEVELS.index(floor)


def violations(pod: Mapping[str, Any], level: str) -> list[str]:
    """Every control of ``level`` (``baseline`` or ``restricted``) the rendered ``pod`` (a Pod's spec)
    breaks, one line each: the DDPJob field, what it holds, and what the level accepts."""
    if level not in LEVELS:
        raise ValueError(f"pod security level {level!r}: expected one of {', '.join(LEVELS)}")
    if level == "privileged":
        return []
    found = list(_baseline(pod, level))
    if level == "restricted":
        found += list(_restricted(pod))
    return list(dict.fromkeys(found))


def _field(container: Mapping[str, Any], index: int, init: bool, user_inits: Sequence[str]) -> str:
    """The DDPJob field a rendered container's securityContext comes from."""
    name = str(container.get("name"))
    if not init:
        return TRAINER
    if name in user_inits:
        return f"spec.podTemplate.initContainers[{user_inits.index(name)}].securityContext"
    return f"initContainers[{index}] ({name}).securityContext"  # ddpjob's own: never expected here


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(DDPJob field, container, its securityContext) for every container, init containers first."""
    inits = list(pod.get("initContainers") or [])
    user_inits = [str(c.get("name")) for c in inits if c.get("name") != names.SYNC_HOOK_INIT_CONTAINER]
    for i, container in enumerate(inits):
        yield _field(container, i, True, user_inits), container, container.get("securityContext") or {}
    for i, container in enumerate(pod.get("containers") or []):
        yield _field(container, i, False, user_inits), container, container.get("securityContext") or {}


def _baseline(pod: Mapping[str, Any], level: str) -> Iterator[str]:
    said = f'Pod Security "{level}"'
    if pod.get("hostNetwork"):
        yield f"spec.podTemplate.hostNetwork: true is not allowed under {said} (host namespaces)"
    for field, container, context in _containers(pod):
        if context.get("privileged"):
            yield f"{field}.privileged: true is not allowed under {said}: leave it out"
        added = set((context.get("capabilities") or {}).get("add") or [])
        if level == "baseline" and (extra := sorted(added - BASELINE_CAPABILITIES)):  # restricted: below
            yield (
                f"{field}.capabilities.add: {', '.join(extra)} is not allowed under {said} (accepted: "
                f"{', '.join(sorted(BASELINE_CAPABILITIES))})"
            )
        if any(port.get("hostPort") for port in container.get("ports") or []):
            yield f"{field}: a hostPort is not allowed under {said}"
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"{field}.seccompProfile.type: Unconfined is not allowed under {said}"
    if ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined":
        yield f"{POD}.seccompProfile.type: Unconfined is not allowed under {said}"
    for volume in _user_volumes(pod):
        if "hostPath" in volume:
            yield f"{_volume_field(volume)}: hostPath is not allowed under {said} (use a claim)"


def _user_volumes(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(pod.get("volumes") or [])


def _volume_field(volume: Mapping[str, Any]) -> str:
    name = volume.get("name")
    return (
        "spec.checkpoint.volume" if name == names.CHECKPOINT_VOLUME else f"spec.podTemplate.volumes ({name})"
    )


def _restricted(pod: Mapping[str, Any]) -> Iterator[str]:
    said = 'Pod Security "restricted"'
    for volume in _user_volumes(pod):
        kinds = [key for key in volume if key != "name"]
        if kinds and kinds[0] not in RESTRICTED_VOLUMES and kinds[0] != "hostPath":
            yield (
                f"{_volume_field(volume)}: {kinds[0]} is not allowed under {said} "
                f"(accepted: {', '.join(sorted(RESTRICTED_VOLUMES))})"
            )
    context = pod.get("securityContext") or {}
    pod_non_root = context.get("runAsNonRoot") is True
    pod_seccomp = (context.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if context.get("runAsUser") == 0:
        yield f"{POD}.runAsUser: 0 (root) is not allowed under {said}"
    if context.get("runAsNonRoot") is False:
        yield f"{POD}.runAsNonRoot: false is not allowed under {said}: leave it out (ddpjob sets true)"
    for field, _, own in _containers(pod):
        if own.get("allowPrivilegeEscalation") is not False:
            yield f"{field}.allowPrivilegeEscalation must be false under {said}"
        if own.get("runAsNonRoot") is False or (not pod_non_root and own.get("runAsNonRoot") is not True):
            yield f"{field}.runAsNonRoot must be true under {said}"
        if own.get("runAsUser") == 0:
            yield f"{field}.runAsUser: 0 (root) is not allowed under {said}"
        seccomp = (own.get("seccompProfile") or {}).get("type")
        if seccomp is None and not pod_seccomp:
            yield f"{field}.seccompProfile.type must be RuntimeDefault or Localhost under {said}"
        capabilities = own.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"{field}.capabilities.drop must include ALL under {said}"
        if extra := sorted(set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}):
            accepted = "(accepted: NET_BIND_SERVICE)"
            yield f"{field}.capabilities.add: {', '.join(extra)} is not allowed under {said} {accepted}"
