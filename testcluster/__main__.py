"""``python -m testcluster up [--kueue] [--real-nodes]|down|status|kueue up|down|sa-kubeconfig NS NAME`` (what
hack/cluster/cluster runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import controlplane, kueue, lifecycle
from .layout import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/cluster/cluster", description="The ddpjob test cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build if needed, start, wait for Ready nodes")
    up.add_argument("--kueue", action="store_true", help="then start Kueue (as `kueue up`)")
    up.add_argument(
        "--real-nodes",
        action="store_true",
        help="then the real nodes (kubelet + containerd), a default StorageClass, the agents cordoned",
    )
    queueing = sub.add_parser(
        "kueue", help="start Kueue on the running cluster (building it first), or stop it"
    )
    queueing.add_argument("action", choices=["up", "down"])
    queueing.add_argument(
        "--pods-ready-timeout", type=float, help="seconds: turn on Kueue's waitForPodsReady with this timeout"
    )
    sub.add_parser("down", help="stop every process, remove pod namespaces and the bridge")
    sub.add_parser("status", help="print whether it is up, the version, and each component's memory")
    sa = sub.add_parser("sa-kubeconfig", help="write a kubeconfig acting as a ServiceAccount; print its path")
    sa.add_argument("namespace")
    sa.add_argument("name")
    args = parser.parse_args(argv)
    layout = Layout.default()
    if args.command == "up":
        try:
            if args.real_nodes:
                from . import byhand  # needs the kubernetes package and pytest; plain `up` does not

                byhand.up(layout)
            else:
                lifecycle.up(layout)
            if args.kueue:
                kueue.start(layout)
                print(f"Kueue up: its log is {layout.log(kueue.NAME)}", file=sys.stderr)
        except (RuntimeError, TimeoutError) as exc:
            print(f"cluster up failed: {exc}", file=sys.stderr)
            return 1
    elif args.command == "kueue" and args.action == "up":
        if not lifecycle.is_up(layout):
            print("the cluster is down: `hack/cluster/cluster up` first", file=sys.stderr)
            return 1
        kueue.start(layout, pods_ready_timeout=args.pods_ready_timeout)
        print(f"Kueue up: its log is {layout.log(kueue.NAME)}")
    elif args.command == "kueue":
        print("Kueue stopped" if kueue.stop(layout) else "Kueue was not running")
    elif args.command == "down":
        lifecycle.down(layout)
    elif args.command == "status":
        if not lifecycle.is_up(layout):
            print("cluster is down")
            return 1
        version = controlplane.server_version(layout)["gitVersion"]
        print(f"cluster up: Kubernetes {version}, kubeconfig {layout.kubeconfig}")
        sizes = lifecycle.rss_kib(layout)
        for name, kib in sizes.items():
            print(f"  {name:<24} {kib / 1024:7.1f} MiB RSS")
        print(f"  {'total':<24} {sum(sizes.values()) / 1024:7.1f} MiB RSS")
        bin_dir = Path(layout.bin_file.read_text().strip())
        times = bin_dir.parent / "build-times"
        print(f"binaries: {bin_dir}")
        if times.exists():
            print("first build: " + "; ".join(times.read_text().splitlines()))
    elif args.command == "sa-kubeconfig":
        from .kubeapi import Kube  # needs the kubernetes package; up/down/status do not

        kube = Kube(str(layout.kubeconfig))
        from . import serviceaccounts

        print(serviceaccounts.write_kubeconfig(kube, layout, args.namespace, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
