"""Pod volumes as the kubelet gives them, for the node agent. Pure.

Each container's ``volumeMounts`` become bind mounts inside the pod's own mount namespace (``ip netns
exec`` gives every pod one, with mounts that do not propagate back to the host), so the process sees the
path the manifest names and nothing else changes:

- ``emptyDir``: a folder of this pod alone (``<pod dir>/volumes/<name>``), gone with the pod's folder;
  a ``medium: Memory`` emptyDir at ``/dev/shm`` keeps the host's shared memory;
- ``hostPath`` and ``persistentVolumeClaim``: refused (a VolumeError, the container's waiting message).
  The pods that mount them, checkpoints above all, run on the real nodes, whose kubelets mount them
  (testcluster/realnode.py); the agents once bound them too, and nothing needs that any more;
- ``projected``, ``configMap``, ``secret``, ``downwardAPI``: a folder of this pod alone, like an
  ``emptyDir``, into which the agent writes the files first (:mod:`projected`): this is how the
  ServiceAccount token and CA reach ``/var/run/secrets/kubernetes.io/serviceaccount``.

A mount point the host lacks is created on the host (the file system is the host's).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_VOLUMES = ("projected", "configMap", "secret", "downwardAPI")
REAL_NODE_VOLUMES = ("hostPath", "persistentVolumeClaim")


class VolumeError(RuntimeError):
    """A volume the agent cannot give the pod (the reason becomes the container's waiting message)."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


def host_folder(volume: Mapping[str, Any], pod_dir: Path) -> Path | None:
    """Where ``volume`` lives on the host; None for a volume the agent leaves alone."""
    if "emptyDir" in volume or any(k in volume for k in FILE_VOLUMES):  # file volumes: see projected.py
        return pod_dir / "volumes" / volume["name"]
    if kind := next((k for k in REAL_NODE_VOLUMES if k in volume), None):
        raise VolumeError(
            f"volume {volume['name']!r} is a {kind}: the node agents mount none; put the pod on a real node"
        )
    return None


def mounts(pod_spec: Mapping[str, Any], container: Mapping[str, Any], pod_dir: Path) -> list[Mount]:
    """The bind mounts of one container, in the order its volumeMounts list them."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    out = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise VolumeError(f"volumeMount {mount['name']!r} names no volume of the pod")
        if mount["mountPath"] == "/dev/shm" and (volume.get("emptyDir") or {}).get("medium") == "Memory":
            continue
        source = host_folder(volume, pod_dir)
        if source is not None:
            if sub := mount.get("subPath"):
                source = source / sub
            out.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return out


def shell_prefix(binds: list[Mount]) -> str:
    """``sh -c`` commands that make each mount, run inside the pod's mount namespace before ``exec``."""
    steps = []
    for m in binds:
        src, dst = shlex.quote(str(m.source)), shlex.quote(m.target)
        # a file (a subPath into a Secret or ConfigMap volume) is bound onto a file, a folder onto a folder
        make = (
            f'if [ -f {src} ]; then mkdir -p "$(dirname {dst})" && {{ [ -e {dst} ] || touch {dst}; }}; '
            f"else mkdir -p {src} {dst}; fi"
        )
        steps.append(f"{make} && mount --bind {src} {dst}")
        if m.read_only:
            steps.append(f"mount -o remount,bind,ro {dst}")
    return "".join(f"{step} && " for step in steps)
