"""`ddpjob`: validate, render, run locally, print the CRD, run the operator.

Long because every subcommand's flags and their help are here, read together as `ddpjob --help` shows
them; what each command does lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ddp_operator import __version__
from ddp_operator.api import crd
from ddp_operator.api.spec import Spec, SpecError, load_documents, other_kinds, parse_file
from ddp_operator.api.spec_warnings import warnings
from ddp_operator.children import objects
from ddp_operator.local.validation import POD_SECURITY_HELP
from ddp_operator.runtime import operator_process


def _load(path: str, docs: list[Any] | None = None) -> list[Spec] | None:
    """The DDPJobs of a file (or of ``docs`` read from it), or None after printing why the API server would
    refuse it."""
    try:
        return parse_file(Path(path), docs)
    except SpecError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return None


def _validate(args: argparse.Namespace) -> int:
    from ddp_operator.local import validation

    failed = False
    for path in args.files:
        specs = _load(path)
        failed = failed or specs is None
        for spec in specs or []:
            print(
                f"{path}: {crd.KIND}/{spec.name}: valid ({spec.nodes} nodes × {spec.procs_per_node} "
                f"procs = {spec.world_size} ranks, {spec.device}/{spec.backend})"
            )
            found = [
                *warnings(spec),
                *validation.script_warnings(spec, [Path.cwd(), Path(path).resolve().parent]),
                *validation.pod_security(spec, args.pod_security),
            ]
            for warning in found:
                print(f"{path}: {crd.KIND}/{spec.name}: warning: {warning}", file=sys.stderr)
    return 1 if failed else 0


def _render(args: argparse.Namespace) -> int:
    specs = _load(args.file)
    if specs is None:
        return 1
    documents = []
    for spec in specs:
        if args.namespace:
            spec = replace(spec, namespace=args.namespace)
        documents += objects.render(spec, attempt=args.attempt)
    print(
        f"# What the operator creates for attempt {args.attempt}; ownerReferences[].uid is the DDPJob's "
        "own uid once it exists."
    )
    print(yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True), end="")
    return 0


def _local(args: argparse.Namespace) -> int:
    from ddp_operator.local import processes, run, scripts

    try:
        docs, skipped = other_kinds(load_documents(Path(args.file)))
    except SpecError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return run.EXIT_INVALID
    for what in skipped:
        print(f"{args.file}: skipped {what}: `ddpjob local` runs the DDPJob only", file=sys.stderr)
    specs = _load(args.file, docs)
    if specs is None:
        return run.EXIT_INVALID
    if len(specs) != 1:
        print(
            f"{args.file}: holds {len(specs)} DDPJobs; `ddpjob local` runs one file with one DDPJob",
            file=sys.stderr,
        )
        return run.EXIT_INVALID
    job_dir = Path(args.file).resolve().parent
    if missing := scripts.missing(specs[0], [Path.cwd(), job_dir]):  # before any pod starts
        for line in missing:
            print(f"{args.file}: {crd.KIND}/{specs[0].name}: {line}", file=sys.stderr)
        return run.EXIT_INVALID
    try:
        return run.run(
            specs[0],
            workdir=Path(args.workdir),
            verbose=args.verbose,
            fresh=args.fresh,
            job_dir=job_dir,
            pod_security=args.pod_security,
        )
    except processes.LocalError as exc:
        print(f"{args.file}: {crd.KIND}/{specs[0].name}: {exc}", file=sys.stderr)
        return run.EXIT_INVALID


def _lease(text: str) -> tuple[str, str]:
    """``--lease``: ``NAMESPACE/NAME``."""
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAMESPACE/NAME")
    return namespace, name


def _crd(args: argparse.Namespace) -> int:
    print(crd.crd_text(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpjob",
        description="Run PyTorch DDP on Kubernetes and prove every rank holds the same model.",
    )
    parser.add_argument("--version", action="version", version=f"ddpjob {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate",
        help="check DDPJob files offline, with the CRD's own schema and CEL rules",
        description="Give, offline, the verdict the API server would give. Exit 1 with one line per "
        "problem (field, value, what is accepted) if any file is refused.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument(
        "--pod-security",
        choices=["baseline", "restricted"],
        help=POD_SECURITY_HELP,
    )
    validate.set_defaults(run=_validate)

    rendered = commands.add_parser(
        "render",
        help="print the Service and Indexed Job the operator creates for a DDPJob",
        description="Print, as multi-document YAML, exactly what the operator creates for one attempt.",
    )
    rendered.add_argument("file", metavar="FILE")
    rendered.add_argument("--attempt", type=int, default=1, help="the gang attempt, from 1 (default 1)")
    rendered.add_argument("--namespace", help="override metadata.namespace (default: the file's, or default)")
    rendered.set_defaults(run=_render)

    run_local = commands.add_parser(
        "local",
        help="run a DDPJob on this machine, as local processes, with the operator's gang semantics",
        description="Run the very same DDPJob here: one process group per pod, the environment Kubernetes "
        "would give it, gang restarts from the checkpoint up to maxRestarts. Exit 0 on success, "
        "1 on failure, 2 on a job that cannot run here, 130 when interrupted (Ctrl-C leaves a "
        "checkpoint; running again resumes).",
    )
    run_local.add_argument("file", metavar="FILE")
    run_local.add_argument(
        "--workdir", default=".ddpjob", help="where checkpoints, logs and volumes go (default .ddpjob/<name>)"
    )
    run_local.add_argument("--verbose", "-v", action="store_true", help="print every pod's output, prefixed")
    run_local.add_argument(
        "--fresh",
        action="store_true",
        help="discard the checkpoint and logs of an earlier unfinished (Failed or Interrupted) run instead "
        "of resuming; an earlier run that Succeeded is never discarded: with or without --fresh it is set "
        "aside as <workdir>/<name>.earlier-N and this run starts anew",
    )
    run_local.add_argument(
        "--pod-security",
        choices=["baseline", "restricted"],
        help=POD_SECURITY_HELP
        + ", at the start, as `ddpjob validate --pod-security` does (here nothing refuses them)",
    )
    run_local.set_defaults(run=_local)

    operate = commands.add_parser(
        "operator",
        help="run the operator (Kopf): reconcile DDPJobs into Services and Indexed Jobs",
        description="Watch DDPJobs and run them. Uses the in-cluster ServiceAccount, else KUBECONFIG.",
    )
    operate.add_argument(
        "--namespace", action="append", help="watch this namespace (repeatable); default: every namespace"
    )
    operate.add_argument(
        "--liveness", default="0.0.0.0:8080", help="host:port of /healthz (default %(default)s)"
    )
    operate.add_argument(
        "--metrics-port", type=int, default=9090, help="port of /metrics (default %(default)s)"
    )
    lease_defaults = (
        10,
        7.0,
        1.0,
    )  # runtime/lease.py's, not imported here (it imports the kubernetes client)
    operate.add_argument(
        "--lease",
        type=_lease,
        metavar="NAMESPACE/NAME",
        help="act only while holding this coordination.k8s.io Lease (created if absent; needs get, "
        "create and update on leases there): replicas with the same lease stand by until its holder is "
        "gone. The chart passes its own, RELEASE_NAMESPACE/RELEASE-ddpjob-operator. Without it: act at once",
    )
    operate.add_argument(
        "--lease-duration",
        type=int,
        default=lease_defaults[0],
        metavar="SECONDS",
        help="with --lease: a standby takes over once the lease went unrenewed this long on its own clock "
        "(default %(default)s)",
    )
    operate.add_argument(
        "--renew-deadline",
        type=float,
        default=lease_defaults[1],
        metavar="SECONDS",
        help="with --lease: the holder ends its process (exit 3) when it could not renew for this long, "
        "shorter than the lease duration (default %(default)s)",
    )
    operate.add_argument(
        "--retry-period",
        type=float,
        default=lease_defaults[2],
        metavar="SECONDS",
        help="with --lease: how often the holder renews and a standby reads the lease (default %(default)s)",
    )
    operate.add_argument(
        "--standalone", action="store_true", help="act at once, without a lease, even with --lease"
    )
    # Kopf's peering is gone (docs/operator.md): the flags of the releases that used it are still accepted
    operate.add_argument("--priority", help=argparse.SUPPRESS)
    operate.add_argument("--peering-lifetime", help=argparse.SUPPRESS)
    operate.add_argument(
        "--check-references",
        action="append",
        metavar="NAMESPACE",
        help="look up (their metadata only) the Secrets and ConfigMaps a DDPJob in this namespace names, "
        "before its pods start, so that a missing one is named before any pod reaches a node (repeatable; "
        "needs get on Secrets and ConfigMaps there: the chart's checkReferences.namespaces). Default: none "
        "looked up, a missing one is named from the kubelet's reason",
    )
    operate.add_argument(
        "--node-health",
        action="store_true",
        help="bad GPUs kept out, for every job: taint the node of a rank the compute probe finds faulty "
        "(ddpjob.io/faulty-gpu=<device>:NoSchedule, a Node condition and Event), and keep new attempts off "
        "nodes whose taints or conditions mark GPUs unhealthy (needs the chart's nodeHealth grant)",
    )
    operate.add_argument(
        "--unhealthy-taints",
        metavar="KEY,KEY",
        help="with --node-health: taint keys that mark a node's GPUs unhealthy (default: "
        "ddpjob.io/faulty-gpu and NVSentinel's nvidia.com/gpu-error, gpu-nvlink-error, syslog-xid-error)",
    )
    operate.add_argument(
        "--unhealthy-conditions",
        metavar="TYPE=STATUS,...",
        help="with --node-health: Node conditions that mark its GPUs unhealthy (default: "
        "AcceleratedHardwareReady=False, GpuPcieWatch=True)",
    )
    operate.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    operate.add_argument("--json-logs", action="store_true", help="structured (JSON) logs, one object a line")
    operate.set_defaults(run=operator_process.operate)

    crd_cmd = commands.add_parser(
        "crd",
        help="print the DDPJob CustomResourceDefinition",
        description="Print the DDPJob CustomResourceDefinition (YAML) this ddpjob ships: its schema, "
        "defaults and validation rules. Install it with `ddpjob crd | kubectl apply --server-side -f -`; "
        "then `kubectl explain ddpjob.spec` documents every field.",
    )
    crd_cmd.set_defaults(run=_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.may_exec = argv is None  # only a real command line may replace its process (the operator does)
    if getattr(args, "attempt", 1) < 1:
        print(f"--attempt: Invalid value: {args.attempt}: must be ≥ 1", file=sys.stderr)
        return 2
    code: int = args.run(args)
    return code
