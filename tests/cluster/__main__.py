"""``python -m cluster up|down|status|sa-kubeconfig NS NAME`` (what hack/cluster/cluster runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import controlplane, lifecycle
from .layout import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/cluster/cluster", description="The ddpjob test cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="build if needed, start, wait for Ready nodes")
    sub.add_parser("down", help="stop every process, remove pod namespaces and the bridge")
    sub.add_parser("status", help="print whether it is up, the version, and each component's memory")
    sa = sub.add_parser("sa-kubeconfig", help="write a kubeconfig acting as a ServiceAccount; print its path")
    sa.add_argument("namespace")
    sa.add_argument("name")
    args = parser.parse_args(argv)
    layout = Layout.default()
    if args.command == "up":
        try:
            lifecycle.up(layout)
        except (RuntimeError, TimeoutError) as exc:
            print(f"cluster up failed: {exc}", file=sys.stderr)
            return 1
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
