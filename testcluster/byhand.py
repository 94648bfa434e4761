"""``make cluster-up REAL_NODES=1``: the test cluster with its real nodes, for a person to try ddpjob on
real containers (``hack/cluster/README.md``, "Real nodes by hand").

Beside the control plane and the node agents it starts ``real-1`` and ``real-2`` (containerd, runc and a
kubelet each, with the operator and trainer images of ``make images`` imported) and the default
StorageClass ``standard`` with its provisioner (:mod:`provisioner`: a claim gets a folder of this machine
that both real nodes mount). It then makes the real nodes the place where pods go, as a kind cluster's
nodes are: the agents are cordoned (they run pods as local processes and mount no claim) and the real nodes'
``ddpjob.io/real-node`` taint, which keeps the test suite's pods off them, is removed. So the README's
``kubectl apply -f examples/quickstart.yaml`` runs unchanged, on real containers, its claim bound.

The test suite starts its own real nodes on a cluster it may share, so it refuses a cluster brought up this
way (:data:`lifecycle.BY_HAND_MARKER`): ``make cluster-down`` first.
"""

from __future__ import annotations

import json
import sys
import time

from . import lifecycle, provisioner, realfixture
from .fixtures import Cluster
from .kubeapi import Kube
from .layout import NODE_NAMES, Layout
from .nodeconfig import TAINT


def up(layout: Layout) -> None:
    lifecycle.up(layout)
    cluster = Cluster(layout, Kube(str(layout.kubeconfig)))
    started = time.monotonic()
    nodes = realfixture.bring_up(cluster, lifecycle.build())
    cluster.kubectl("apply", "-f", "-", input=json.dumps(provisioner.storage_class()))
    volumes = str(layout.root / "volumes")
    lifecycle.spawn_module(layout, lifecycle.PROVISIONER, "testcluster.provisioner", "--root", volumes)
    for agent in NODE_NAMES:
        cluster.kubectl("cordon", agent)
    for node in nodes:
        cluster.kubectl("taint", "nodes", node.name, f"{TAINT['key']}:{TAINT['effect']}-")
    (layout.root / lifecycle.BY_HAND_MARKER).write_text("")
    names = ", ".join(n.name for n in nodes)
    print(
        f"real nodes {names} Ready and untainted, the agents {', '.join(NODE_NAMES)} cordoned, default "
        f"StorageClass {provisioner.DEFAULT_CLASS} (volumes under {layout.root / 'volumes'}) in "
        f"{time.monotonic() - started:.0f} s; `make cluster-down` stops it all",
        file=sys.stderr,
    )
