"""Runs one pod that the scheduler bound to one of the agent's nodes, as a container runtime would.

The pod gets its own network namespace (:mod:`netns`) and UTS namespace (its hostname); each container is
a process group started with the pod's resolved environment and command line
(:mod:`ddp_operator.api.kubelet`), in the
agent's Python environment (its ``bin`` directory first on ``PATH``), with stdout and stderr in a log file
under ``.cluster/pods/<ns>_<pod>_<uid>/``. The image name is ignored.

Termination messages: ``/dev/termination-log`` cannot be given to a plain process, so every container
gets ``DDPJOB_TERMINATION_LOG`` naming a real file; what the process writes there becomes the
termination message (``FallbackToLogsOnError`` is honoured). Readiness probes are not run: a running
container is ready.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from ddp_operator.api import kubelet

from . import images, netns, podstatus, processes, projected, serviceproxy, volumes
from .kubeapi import Kube, final_delete_options
from .layout import CLUSTER_DOMAIN, Layout
from .podstatus import ContainerRun

log = logging.getLogger("nodeagent.pod")

BACKOFF_START, BACKOFF_MAX = 1.0, 10.0
CONFIG_RETRY = 2.0
STATUS_RETRY_SECONDS, STATUS_RETRY_EVERY = 120.0, 0.5
"""How long a status update waits for an API server that does not answer (it restarts), how often it asks."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    index: int
    host_ip: str
    pod_cidr: str
    allocatable: Mapping[str, str] = field(default_factory=dict)


def pod_bin_dir() -> Path:
    """The ``bin`` directory first on every container's PATH: ``$DDPJOB_POD_BIN``, else the agent's
    Python environment's (so ``python`` and ``torchrun`` in a pod are that environment's)."""
    return Path(os.environ.get("DDPJOB_POD_BIN") or Path(sys.executable).parent)


def base_environment() -> dict[str, str]:
    """What every container starts from: the pod Python environment on PATH, HOME, a UTF-8 locale."""
    path = [
        str(pod_bin_dir()),
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    return {"PATH": ":".join(dict.fromkeys(path)), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


class PodRunner:
    """Owns one pod's namespace and processes; runs on its own thread until the pod ends."""

    def __init__(
        self,
        *,
        kube: Kube,
        layout: Layout,
        node: NodeInfo,
        pod: dict[str, Any],
        pod_ip: str,
        on_exit: Callable[[PodRunner], None],
    ) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        self.kube, self.node, self.pod, self.pod_ip, self.on_exit = kube, node, pod, pod_ip, on_exit
        self.uid, self.namespace, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.dir = layout.pods / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.netns = netns.netns_name(self.uid)
        self.spec = spec
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.init_containers = list(spec.get("initContainers") or [])
        self.containers = list(spec.get("containers") or [])
        self.init_runs = [ContainerRun(c["name"], c.get("image", "")) for c in self.init_containers]
        self.runs = [ContainerRun(c["name"], c.get("image", "")) for c in self.containers]
        self.start_time = podstatus.now_rfc3339()
        self._started_mono = time.monotonic()
        self._last_status: dict[str, Any] = dict(pod.get("status") or {})
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self._grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self._deleting = False
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._main, name=f"pod {self.namespace}/{self.name}", daemon=True
        )

    # -- control, from the agent's thread ------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def terminate(self, grace: float, *, delete: bool = True) -> None:
        """Deletion requested: SIGTERM, ``grace`` s, SIGKILL; then (``delete``) remove the Pod object."""
        with self._lock:
            if not self._stop.is_set() or grace < self._grace:
                self._grace = grace
            self._deleting = delete
        self._stop.set()

    def log_path(self, container: str) -> Path:
        return self.dir / f"{container}.log"

    def container_running(self, container: str) -> bool:
        proc = self._procs.get(container)
        return proc is not None and proc.poll() is None

    # -- the pod's thread ---------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as exc:  # report it on the pod: a test then fails with the reason, not a hang
            log.exception("pod %s/%s", self.namespace, self.name)
            self._kill_all(0)
            self._report(phase="Failed", reason="NodeAgentError", message=f"{type(exc).__name__}: {exc}")
        finally:
            self._kill_all(0)
            netns.delete_pod_netns(self.netns)
            if self._deleting:
                self.kube.delete(
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                    final_delete_options(self.uid),
                )
            self.done.set()
            self.on_exit(self)

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        hostname = (self.spec.get("hostname") or self.name)[:63]
        subdomain = self.spec.get("subdomain")
        fqdn = f"{hostname}.{subdomain}.{self.namespace}.svc.{CLUSTER_DOMAIN}" if subdomain else None
        self.hostname = hostname
        netns.create_pod_netns(
            self.netns,
            self.pod_ip,
            resolv=netns.resolv_conf(
                self.namespace, search=(self.spec.get("dnsConfig") or {}).get("searches", [])
            ),
            hosts=netns.hosts_file(self.pod_ip, hostname, fqdn),
        )
        self._report()
        for container, run in zip(self.init_containers, self.init_runs, strict=True):
            if not self._run_init(container, run):
                return
        self._run_containers()

    def _run_init(self, container: dict[str, Any], run: ContainerRun) -> bool:
        backoff = BACKOFF_START
        while True:
            if not self._launch(container, run):
                self._report()
                if self._wait(CONFIG_RETRY):
                    return self._interrupted()
                continue
            self._report()
            while self._procs[run.name].poll() is None:
                if self._wait(0.1):
                    return self._interrupted()
            self._reap(container, run)
            if run.exit_code == 0:
                self._report()
                return True
            if self.restart_policy == "Never":
                self._report()
                return False
            run.restarting()
            self._report()
            if self._wait(backoff):
                return self._interrupted()
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _run_containers(self) -> None:
        due = {run.name: 0.0 for run in self.runs}  # container -> when to (re)start it
        backoff = {run.name: BACKOFF_START for run in self.runs}
        pairs = list(zip(self.containers, self.runs, strict=True))
        while True:
            changed = False
            now = time.monotonic()
            for container, run in pairs:
                if run.name in due and due[run.name] <= now:
                    if self._launch(container, run):
                        del due[run.name]
                    else:
                        due[run.name] = now + CONFIG_RETRY
                    changed = True
            for container, run in pairs:
                proc = self._procs.get(run.name)
                if run.state == "running" and proc is not None and proc.poll() is not None:
                    self._reap(container, run)
                    changed = True
                    if podstatus.will_restart(self.restart_policy, run.exit_code or 0):
                        run.restarting()
                        due[run.name] = time.monotonic() + backoff[run.name]
                        backoff[run.name] = min(backoff[run.name] * 2, BACKOFF_MAX)
            if changed:
                self._report()
            if not due and all(run.state == "terminated" for run in self.runs):
                return
            if self._wait(0.1):
                self._interrupted()
                return

    # -- helpers ------------------------------------------------------------------------------------------
    def _wait(self, seconds: float) -> bool:
        """Sleeps up to ``seconds``; True when the pod must stop (deletion or activeDeadlineSeconds)."""
        return self._stop.wait(seconds) or self._deadline_exceeded()

    def _deadline_exceeded(self) -> bool:
        deadline = self.spec.get("activeDeadlineSeconds")
        return deadline is not None and time.monotonic() - self._started_mono > float(deadline)

    def _interrupted(self) -> bool:
        deleting = self._stop.is_set()
        self._kill_all(self._grace)
        if deleting:
            all_ok = all(r.exit_code == 0 for r in self.runs if r.state == "terminated") and all(
                r.state == "terminated" for r in self.runs
            )
            self._report(phase="Succeeded" if all_ok else "Failed")
        else:
            self._report(
                phase="Failed",
                reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline",
            )
        return False

    def _launch(self, container: dict[str, Any], run: ContainerRun) -> bool:
        container = images.container_argv(container)  # an upstream monitoring image: its binary
        try:
            env = kubelet.resolve_env(
                self.pod,
                container,
                pod_ip=self.pod_ip,
                host_ip=self.node.host_ip,
                config_maps=self._text(self._config_map),
                secrets=self._text(self._secret),
                node_allocatable=self.node.allocatable,
            )
            argv = kubelet.pod_command(container, env)
            binds = volumes.mounts(self.spec, container, self.dir)
            self._write_volume_files(container)
        except (kubelet.ResolveError, volumes.VolumeError) as exc:
            run.state, run.reason, run.message = "waiting", "CreateContainerConfigError", str(exc)
            return False
        termination_log = self.dir / f"{run.name}.termination-log"
        termination_log.write_bytes(b"")
        full_env = {
            **base_environment(),
            "HOSTNAME": self.hostname,
            "TMPDIR": str(self.dir / "tmp"),  # the container's own /tmp (pods share the host's file system)
            **serviceproxy.master_service_env(self.kube.get_or_none(serviceproxy.MASTER_SERVICE_PATH)),
            **env,
            "DDPJOB_TERMINATION_LOG": str(termination_log),
        }
        workdir = Path(container.get("workingDir") or self.dir / "work")
        workdir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        proc = processes.spawn(
            run.name,
            [*netns.exec_prefix(self.netns, self.hostname, volumes.shell_prefix(binds)), *argv],
            pid_file=self.dir / f"{run.name}.pid",
            log_file=self.log_path(run.name),
            env=full_env,
            cwd=workdir,
        )
        self._procs[run.name] = proc
        run.started(f"ddpjob://{self.node.name}/{proc.pid}", podstatus.now_rfc3339())
        log.info(
            "pod %s/%s container %s started: pid %d: %s", self.namespace, self.name, run.name, proc.pid, argv
        )
        return True

    def _reap(self, container: dict[str, Any], run: ContainerRun, reason: str = "") -> None:
        proc = self._procs[run.name]
        returncode = proc.wait()
        with contextlib.suppress(ProcessLookupError):  # nothing a container started outlives its main process
            os.killpg(proc.pid, signal.SIGKILL)
        (self.dir / f"{run.name}.pid").unlink(missing_ok=True)
        message = podstatus.termination_message(
            _read(self.dir / f"{run.name}.termination-log"),
            _tail(self.log_path(run.name)),
            policy=container.get("terminationMessagePolicy") or "File",
            exit_code=returncode,
        )
        run.exited(returncode, message, podstatus.now_rfc3339(), reason)
        log.info("pod %s/%s container %s exited: %s", self.namespace, self.name, run.name, run.exit_code)

    def _kill_all(self, grace: float) -> None:
        alive = {name: proc for name, proc in self._procs.items() if proc.poll() is None}
        for proc in alive.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in alive.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        specs = {c["name"]: c for c in self.init_containers + self.containers}
        runs = {r.name: r for r in self.init_runs + self.runs}
        for proc in alive.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        # every container still marked running, including one that exited on its own just before the stop
        # (not in ``alive``): a kubelet records its exit code and termination message, and so must we
        for name in self._procs:
            if runs[name].state == "running":
                self._reap(specs[name], runs[name])

    def _report(self, phase: str | None = None, reason: str = "", message: str = "") -> None:
        status = podstatus.pod_status(
            self._last_status,
            restart_policy=self.restart_policy,
            init_runs=self.init_runs,
            runs=self.runs,
            pod_ip=self.pod_ip,
            host_ip=self.node.host_ip,
            start_time=self.start_time,
            sandbox_ready=not self.done.is_set(),
            phase=phase,
            reason=reason,
            message=message,
        )
        body = {"metadata": {"uid": self.uid}, "status": status}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"
        deadline = time.monotonic() + STATUS_RETRY_SECONDS
        while True:
            try:
                result = self.kube.patch(path, body)
                break
            except urllib3.exceptions.HTTPError as exc:  # the API server does not answer (it restarts)
                if time.monotonic() > deadline:
                    log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, exc)
                    return
                # as a kubelet keeps syncing: a pod that ended while the API server was down says so after
                log.info(
                    "pod %s/%s: status update waits for the API server: %s", self.namespace, self.name, exc
                )
                time.sleep(STATUS_RETRY_EVERY)
            except Exception as exc:  # the pod may be gone or replaced; the next report tries again
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, exc)
                return
        if result:
            self._last_status = result.get("status") or {}

    def _write_volume_files(self, container: dict[str, Any]) -> None:
        """The files of the file-backed volumes ``container`` mounts (ServiceAccount token, CA, ...)."""
        sources = projected.Sources(config_map=self._config_map, secret=self._secret, token=self._token)
        wanted = {m["name"] for m in container.get("volumeMounts") or []}
        for volume in self.spec.get("volumes") or []:
            if volume["name"] in wanted and projected.is_file_volume(volume):
                folder = volumes.host_folder(volume, self.dir)
                assert folder is not None
                projected.write(folder, projected.volume_files(self.pod, volume, sources))

    def _token(self, account: str, seconds: int, audience: str | None) -> str:
        """A token for ``account`` bound to this pod (TokenRequest API), as the kubelet asks for one."""
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
        }
        if audience:
            spec["audiences"] = [audience]
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        result = self.kube.create(
            path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        )
        return str(result["status"]["token"])

    def _config_map(self, namespace: str, name: str) -> Mapping[str, str | bytes] | None:
        obj = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if obj is None:
            return None
        binary = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        return {**(obj.get("data") or {}), **binary}

    @staticmethod
    def _text(lookup: projected.DataLookup) -> Callable[[str, str], Mapping[str, str] | None]:
        """``lookup`` for environment variables, which are text."""

        def text(namespace: str, name: str) -> Mapping[str, str] | None:
            data = lookup(namespace, name)
            if data is None:
                return None
            return {k: v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in data.items()}

        return text

    def _secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        obj = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if obj is None:
            return None
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _tail(path: Path, size: int = 16384) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read()
    except OSError:
        return b""
