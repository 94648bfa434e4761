"""Bring the whole test cluster up, find out whether it is up, and take it down again.

``up`` builds (or finds cached) binaries, writes fresh certificates and tokens, creates the pod bridge,
starts etcd → kube-apiserver → CoreDNS, kube-controller-manager, kube-scheduler → node agent, and returns
once both Nodes are Ready and the ``default`` ServiceAccount exists. Every process has a pid file under
``.cluster/pids``; ``down`` stops them all (the node agent first, which stops its pods), then kills any pod
process a crashed agent left (their pid files are under ``.cluster/pods``) and removes every pod network
namespace and the bridge. Logs stay in ``.cluster/logs`` until the next ``up``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import controlplane, kueue, netns, processes, realnode
from .layout import BUILD_SCRIPT, NODE_NAMES, Layout

if TYPE_CHECKING:
    from . import kubeapi

AGENTS = tuple(f"node-agent-{node}" for node in NODE_NAMES)  # one per Node, like kubelets
COMPONENTS = ("etcd", "kube-apiserver", "coredns", "kube-controller-manager", "kube-scheduler", *AGENTS)
PACKAGE_PARENT = (
    Path(__file__).resolve().parent.parent
)  # on PYTHONPATH, the node agent is testcluster.nodeagent
PROVISIONER = "provisioner"  # the default StorageClass's, with REAL_NODES=1 (byhand.py)
BY_HAND_MARKER = "real-nodes-by-hand"  # in the cluster's folder: brought up for people (byhand.py)
# Ports, the bridge and the pod namespaces are machine-wide: one cluster per machine. This file names the
# cluster directory that owns them, so a second work tree refuses to start instead of breaking the first.
OWNER_FILE = Path("/run/ddpjob-test-cluster.owner")

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(say: Say = _say) -> Path:
    """The directory of the control-plane binaries, building them first if this machine has none."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {result.returncode}); its output is above")
    return Path(result.stdout.strip().splitlines()[-1])


def is_up(layout: Layout) -> bool:
    if any(processes.read_pid(layout.pid(name)) is None for name in COMPONENTS):
        return False
    try:
        return controlplane.apiserver_ready(layout)
    except OSError:
        return False


def rss_kib(layout: Layout) -> dict[str, int]:
    """Resident memory of each running component (KiB), its threads and children included."""
    sizes = {}
    for name in COMPONENTS:
        pid = processes.read_pid(layout.pid(name))
        if pid is None:
            continue
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes[name] = int(line.split()[1])
    return sizes


def _nodes_ready(kube: kubeapi.Kube, names: tuple[str, ...] = NODE_NAMES) -> bool:
    nodes = {n["metadata"]["name"]: n for n in kube.get("/api/v1/nodes")["items"]}
    for name in names:
        conditions = {
            c["type"]: c["status"] for c in (nodes.get(name, {}).get("status") or {}).get("conditions", [])
        }
        if conditions.get("Ready") != "True":
            return False
    return True


def up(layout: Layout | None = None, *, say: Say = _say) -> dict[str, float]:
    """Starts the cluster unless it is up already; returns timings in seconds."""
    layout = layout or Layout.default()
    if is_up(layout):
        say(f"cluster already up; kubeconfig: {layout.kubeconfig}")
        return {}
    owner = _owner()
    if owner is not None and owner != layout.root and is_up(Layout(owner)):
        raise RuntimeError(
            f"another test cluster runs on this machine, from {owner}: use it (DDPJOB_CLUSTER_DIR={owner}) "
            f"or stop it (DDPJOB_CLUSTER_DIR={owner} hack/cluster/cluster down)"
        )
    down(layout, say=lambda _: None, force=True)
    started = time.monotonic()
    bin_dir = build(say)
    timings = {"build": time.monotonic() - started}
    shutil.rmtree(layout.root, ignore_errors=True)
    controlplane.generate(layout)
    layout.bin_file.write_text(f"{bin_dir}\n")
    OWNER_FILE.write_text(f"{layout.root}\n")
    netns.ensure_bridge()
    t0 = time.monotonic()

    controlplane.start_etcd(layout, bin_dir)
    controlplane.wait_until("etcd", controlplane.etcd_healthy, timeout=60, log=layout.log("etcd"))
    controlplane.start_apiserver(layout, bin_dir)
    controlplane.wait_until(
        "kube-apiserver",
        lambda: controlplane.apiserver_ready(layout),
        timeout=180,
        log=layout.log("kube-apiserver"),
    )
    from . import kubeapi  # here, not at the top: `down` must work without the kubernetes package

    kube = kubeapi.Kube(str(layout.kubeconfig))
    for path, obj in controlplane.bootstrap_objects():
        try:
            kube.create(path, obj)
        except kubeapi.ApiError as exc:
            if exc.status != 409:
                raise
    controlplane.start_coredns(layout, bin_dir)
    controlplane.start_controller_manager(layout, bin_dir)
    controlplane.start_scheduler(layout, bin_dir)
    for node in NODE_NAMES:
        start_node(layout, node)
    controlplane.wait_until("CoreDNS", controlplane.coredns_ready, timeout=120, log=layout.log("coredns"))
    controlplane.wait_until("Nodes Ready", lambda: _nodes_ready(kube), timeout=120, log=layout.log(AGENTS[0]))
    controlplane.wait_until(
        "ServiceAccount default/default",
        lambda: kube.get_or_none("/api/v1/namespaces/default/serviceaccounts/default") is not None,
        timeout=120,
        log=layout.log("kube-controller-manager"),
    )
    timings["start"] = time.monotonic() - t0
    timings["total"] = time.monotonic() - started
    version = controlplane.server_version(layout)["gitVersion"]
    say(
        f"cluster up: Kubernetes {version}, nodes {', '.join(NODE_NAMES)} Ready; "
        f"binaries {timings['build']:.1f} s, start {timings['start']:.1f} s"
    )
    say(f"kubeconfig: {layout.kubeconfig}   (export KUBECONFIG={layout.kubeconfig})")
    return timings


def start_node(layout: Layout, node: str) -> None:
    """Starts the node agent of ``node`` (it registers the Node again if it is gone, and reports the
    pods a previous agent of the node had started as Failed: their processes went with it)."""
    spawn_module(layout, f"node-agent-{node}", "testcluster.nodeagent", "--node", node)


def spawn_module(layout: Layout, name: str, module: str, *args: str) -> None:
    """Starts ``python -m module --kubeconfig <the cluster's> *args`` as component ``name`` of this
    cluster: its own session, its pid file and log under the cluster's folder, this package importable."""
    processes.spawn(
        name,
        [sys.executable, "-m", module, "--kubeconfig", str(layout.kubeconfig), *args],
        pid_file=layout.pid(name),
        log_file=layout.log(name),
        env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT), "PYTHONUNBUFFERED": "1"},
    )


def restart_apiserver(layout: Layout, *, down_seconds: float = 0.0) -> float:
    """Stops kube-apiserver (SIGTERM, SIGKILL 2 s later), waits ``down_seconds``, starts it again on the
    same etcd and waits until it is ready; returns how long it was unreachable."""
    bin_dir = Path(layout.bin_file.read_text().strip())
    stopped = time.monotonic()
    processes.stop(layout.pid("kube-apiserver"), grace=2)  # a crash, not a drain of every watch
    time.sleep(down_seconds)  # the outage itself (what the test is about), not a wait for a condition
    controlplane.start_apiserver(layout, bin_dir)
    controlplane.wait_until(
        "kube-apiserver (restarted)",
        lambda: controlplane.apiserver_ready(layout),
        timeout=180,
        log=layout.log("kube-apiserver"),
    )
    return time.monotonic() - stopped


def _owner() -> Path | None:
    try:
        return Path(OWNER_FILE.read_text().strip())
    except OSError:
        return None


def down(layout: Layout | None = None, *, say: Say = _say, force: bool = False) -> None:
    """Stops everything ``up`` started, even after a crash; safe to run twice. The machine-wide parts
    (pod namespaces, bridge) are removed only when this cluster owns them (or ``force``)."""
    layout = layout or Layout.default()
    stopped = realnode.down(layout)  # kubelets and containerds of real nodes, and their containers
    if processes.stop(layout.pid(kueue.NAME), grace=5):  # its webhooks go with etcd's data at the next up
        stopped.append(kueue.NAME)
    if processes.stop(layout.pid(PROVISIONER), grace=2):
        stopped.append(PROVISIONER)
    (layout.root / BY_HAND_MARKER).unlink(missing_ok=True)
    for name in reversed(COMPONENTS):  # node agent first: it stops its pods
        if processes.stop(layout.pid(name), grace=15 if name in AGENTS else 10):
            stopped.append(name)
    leftovers = 0
    if layout.pods.exists():
        for pid_file in layout.pods.glob("*/*.pid"):
            leftovers += processes.stop(pid_file, grace=0)
    owner = _owner()
    namespaces = []
    if force or owner is None or owner == layout.root:
        namespaces = netns.list_pod_netns()
        for ns in namespaces:
            netns.delete_pod_netns(ns)
        netns.remove_bridge()
        OWNER_FILE.unlink(missing_ok=True)
    say(
        f"cluster down: stopped {', '.join(stopped) or 'nothing'}; "
        f"{leftovers} leftover pod processes, {len(namespaces)} pod namespaces removed"
    )
