"""What runs where in ``ddpjob local``: the pods of one attempt as local processes. Pure: no I/O.

The Indexed Job that ``render`` produces expands into one "pod" per completion index; each pod's container
command runs as a local process group with the environment the kubelet would give it (``kubelet``),
except that the rank-0 host name resolves to this machine, each pod gets its own metrics port, and volumes
map to folders under the run directory. Ports, folders and processes are the business of ``host`` and
``run``; this module only computes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_operator.api import kubelet, names
from ddp_operator.api.spec import Spec
from ddp_operator.children import render
from ddp_operator.decide import restarts
from ddp_operator.local import scripts
from ddp_trainer import contract

Obj = dict[str, Any]
LOCAL_ADDR = "127.0.0.1"


class LocalError(RuntimeError):
    """A job that cannot run on this machine, with what to do about it."""


@dataclass(frozen=True)
class LocalPod:
    """One pod of one attempt, ready to start."""

    index: int
    name: str
    argv: list[str]
    env: dict[str, str]
    metrics_port: int
    log_path: Path
    termination_path: Path
    workdir: Path
    """The pod's own folder: its ``/tmp`` and what its init commands leave (a container's is its own too)."""
    cwd: Path
    """Where its command runs (:func:`command_dir`), shared by every pod."""
    volumes: tuple[Path, ...] = ()
    """The folders its volumes map to, made before it starts (the kubelet mounts them first)."""
    init: tuple[tuple[str, ...], ...] = ()
    """Command lines to run to completion before it starts: the sync hook's init container
    (``spec.syncCheck.autoInstrument``); the user's init containers do not run here."""


def pod_object(job: Mapping[str, Any], index: int) -> Obj:
    """The Pod the Job controller creates for ``index``: the template plus its index and host name."""
    template = job["spec"]["template"]
    name = f"{job['metadata']['name']}-{index}"
    annotations = {
        **template["metadata"].get("annotations", {}),
        names.COMPLETION_INDEX_ANNOTATION: str(index),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job["metadata"]["namespace"],
            "labels": {
                **template["metadata"].get("labels", {}),
                names.COMPLETION_INDEX_ANNOTATION: str(index),
            },
            "annotations": annotations,
        },
        "spec": {**template["spec"], "hostname": name},
        "status": {"podIP": LOCAL_ADDR, "hostIP": LOCAL_ADDR},
    }


def volume_dirs(job: Mapping[str, Any], run_dir: Path) -> dict[str, Path]:
    """mountPath → local folder. /dev/shm is this machine's; hostPath volumes are themselves; every other
    volume (the checkpoint's included) is a folder under the run directory, shared by all pods and kept
    across attempts so that a gang restart resumes as it does on a cluster with a shared volume."""
    pod = job["spec"]["template"]["spec"]
    sources = {volume["name"]: volume for volume in pod.get("volumes", [])}
    dirs = {}
    for mount in pod["containers"][0].get("volumeMounts", []):
        if mount["mountPath"] == "/dev/shm":
            continue
        source = sources.get(mount["name"], {})
        if "hostPath" in source:
            dirs[mount["mountPath"]] = Path(source["hostPath"]["path"])
        else:
            dirs[mount["mountPath"]] = run_dir / "volumes" / mount["name"]
    return dirs


def remap_path_list(text: str, dirs: Mapping[str, Path]) -> str:
    """:func:`remap` for each entry of a ``PYTHONPATH``-like list."""
    return os.pathsep.join(remap(part, dirs) for part in text.split(os.pathsep))


def init_commands(job: Mapping[str, Any], dirs: Mapping[str, Path]) -> tuple[tuple[str, ...], ...]:
    """The init containers that run here: the sync hook's alone (it comes from the trainer image, whose
    code is this Python environment's), its paths remapped to the local folders."""
    pod = job["spec"]["template"]["spec"]
    return tuple(
        tuple(remap(part, dirs) for part in [*container.get("command", []), *container.get("args", [])])
        for container in pod.get("initContainers", [])
        if container["name"] == names.SYNC_HOOK_INIT_CONTAINER
    )


def remap(text: str, dirs: Mapping[str, Path]) -> str:
    """Point a path (alone, or after `=` in a flag) inside a mounted volume at its local folder."""
    for mount_path, local in sorted(dirs.items(), key=lambda item: -len(item[0])):
        head, sep, tail = text.rpartition("=") if "=" in text else ("", "", text)
        if tail == mount_path or tail.startswith(mount_path.rstrip("/") + "/"):
            return f"{head}{sep}{local}{tail[len(mount_path) :]}"
    return text


def secrets_from_host(container: Mapping[str, Any], host_env: Mapping[str, str]) -> Obj:
    """The container with each ConfigMap/Secret-sourced variable taken from this machine's environment
    (there is no API server to read them from); one that is not set here is an error naming it. ``envFrom``
    sources are dropped: their variables come from this machine's environment, which reaches every pod."""
    env = []
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
        if ref is None:
            env.append(var)
        elif var["name"] in host_env:
            env.append({"name": var["name"], "value": host_env[var["name"]]})
        elif not ref.get("optional"):
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            raise LocalError(
                f"spec.env {var['name']} comes from {kind} {ref.get('name')!r} (key {ref.get('key')!r}), "
                f"which does not exist on this machine: export {var['name']}=... before `ddpjob local` "
                "to provide it"
            )
    return {**{k: v for k, v in container.items() if k != "envFrom"}, "env": env}


def local_pods(
    spec: Spec,
    attempt: int,
    run_dir: Path,
    *,
    master_port: int,
    metrics_ports: list[int],
    host_env: Mapping[str, str],
    gpus: list[int] | None = None,
    launch_dir: Path = Path("/"),
    job_dir: Path | None = None,
    restarts_used: int | None = None,
) -> list[LocalPod]:
    """Every pod of ``attempt``, its command line and environment resolved as the kubelet would. Each pod
    keeps a folder of its own (its ``/tmp``); ``launch_dir`` (where ``ddpjob local`` was started) stands in
    for the image's code: the commands run there (:func:`command_dir`), a relative script path there, or
    else in ``job_dir`` (the DDPJob file's), becomes absolute, and it is on PYTHONPATH."""
    used = restarts.restarts_used(attempt) if restarts_used is None else restarts_used
    job = render.render_job(spec, attempt, restarts.left(spec.max_restarts, used))
    container = secrets_from_host(job["spec"]["template"]["spec"]["containers"][0], host_env)
    dirs = volume_dirs(job, run_dir)
    cwd, _ = command_dir(spec.working_dir, dirs, launch_dir)
    attempt_dir = run_dir / f"attempt-{attempt}"
    replacements = {
        render.master_addr(spec, attempt): LOCAL_ADDR,
        str(spec.master_port): str(master_port),
    }
    pods = []
    for index in range(spec.nodes):
        pod = pod_object(job, index)
        env = kubelet.resolve_env(pod, container, pod_ip=LOCAL_ADDR, host_ip=LOCAL_ADDR)
        for key in ("PET_MASTER_ADDR", "MASTER_ADDR", "PET_MASTER_PORT", "MASTER_PORT"):
            if key in env:
                env[key] = replacements.get(env[key], env[key])
        if contract.PET_RDZV_ENDPOINT in env:
            env[contract.PET_RDZV_ENDPOINT] = f"{LOCAL_ADDR}:{master_port}"
        if contract.PET_LOCAL_ADDR in env:  # torchrun orders the agents by it: pod 0 must come first
            env[contract.PET_LOCAL_ADDR] = f"127.0.0.{index + 1}"
        env = {
            key: remap_path_list(value, dirs) if key == contract.PYTHONPATH else remap(value, dirs)
            for key, value in env.items()
        }
        name = pod["metadata"]["name"]
        termination = attempt_dir / f"{name}.termination-log"
        env[contract.METRICS_PORT_ENV] = str(metrics_ports[index])
        env[contract.TERMINATION_LOG_ENV] = str(termination)
        if gpus is not None:
            per_pod = gpus[index * spec.procs_per_node : (index + 1) * spec.procs_per_node]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, per_pod))
        argv = [remap(part, dirs) for part in kubelet.pod_command(with_entrypoint(container), env)]
        pods.append(
            LocalPod(
                index,
                name,
                [absolute_if_here(part, launch_dir, *([job_dir] if job_dir else [])) for part in argv],
                env,
                metrics_ports[index],
                attempt_dir / f"{name}.log",
                termination,
                workdir=attempt_dir / name,
                cwd=cwd,
                volumes=tuple(path for path in dirs.values() if run_dir in path.parents),
                init=init_commands(job, dirs),
            )
        )
    return pods


def command_dir(
    working_dir: str | None,
    dirs: Mapping[str, Path],
    launch_dir: Path,
    is_dir: Callable[[Path], bool] = Path.is_dir,
) -> tuple[Path, str | None]:
    """Where the pods' commands run here, and a note when that is not ``spec.workingDir``: the folder
    ``ddpjob local`` was started in, as torchrun started by hand would run (here that folder is the image's
    code), unless ``spec.workingDir`` is inside a volume (its local folder) or exists on this machine. Every
    pod shares it, as pods share a volume; what must stay private (``/tmp``) is in each pod's own folder."""
    if not working_dir:
        return launch_dir, None
    local = remap(working_dir, dirs)
    if local != working_dir or is_dir(Path(local)):
        return Path(local), None
    return launch_dir, (
        f"spec.workingDir {working_dir}: a folder of the image, not on this machine; the commands run in "
        f"{launch_dir}, where ddpjob local was started"
    )


def with_entrypoint(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """A container without ``command`` runs the image's ENTRYPOINT with its ``args``: the trainer image's
    (torchrun), as a pod of that image would."""
    if container.get("command"):
        return container
    return {**container, "command": list(contract.IMAGE_ENTRYPOINT)}


def absolute_if_here(part: str, *dirs: Path) -> str:
    """A relative path to a file in one of ``dirs`` (the first that has it) as an absolute one (the pod
    runs elsewhere; :mod:`ddp_operator.local.scripts`)."""
    found = scripts.find(part, dirs)
    return str(found) if found is not None else part


def tmp_dir(pod: LocalPod) -> Path:
    """The pod's ``/tmp``: inside its working directory, so nothing it leaves there outlives the run's
    folder or is seen by another pod (the trainer's metrics files live there)."""
    return pod.workdir / "tmp"


def process_env(pod: LocalPod, host_env: Mapping[str, str], launch_dir: Path | None = None) -> dict[str, str]:
    """This machine's environment under the pod's, with this Python environment's scripts first on PATH,
    ``launch_dir`` last on PYTHONPATH (a model factory or module next to the DDPJob file imports) and a
    ``TMPDIR`` of the pod's own (:func:`tmp_dir`), as each container has its own ``/tmp``."""
    scripts = str(Path(sys.executable).parent)
    path = host_env.get("PATH", "")
    env = {**host_env, **pod.env, "PATH": f"{scripts}{os.pathsep}{path}" if path else scripts}
    env["TMPDIR"] = str(tmp_dir(pod))
    if launch_dir is not None:
        python_path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = f"{python_path}{os.pathsep}{launch_dir}" if python_path else str(launch_dir)
    return env


def init_env(host_env: Mapping[str, str]) -> dict[str, str]:
    """An init container's environment: this machine's, this Python environment's scripts first on PATH,
    none of the trainer container's variables (its PYTHONPATH names the volume being filled)."""
    scripts = str(Path(sys.executable).parent)
    env = {key: value for key, value in host_env.items() if key != contract.PYTHONPATH}
    env["PATH"] = f"{scripts}{os.pathsep}{env['PATH']}" if env.get("PATH") else scripts
    return env


def check_devices(spec: Spec, gpus_here: int) -> None:
    """Refuse a cuda job this machine cannot run, before anything starts."""
    if spec.device == "cuda" and gpus_here < spec.world_size:
        raise LocalError(
            f"spec.device is cuda and the job needs {spec.world_size} GPUs ({spec.nodes} nodes × "
            f"{spec.procs_per_node} procsPerNode, one per process), but this machine has {gpus_here}: "
            "set device: cpu to run it here, or lower nodes/procsPerNode"
        )
