"""`ddpjob`: validate, render, run locally, print the CRD, run the operator.

Long because every subcommand's flags and their help are here, read together as `ddpjob --help` shows
them; what each command does lives in its own module."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ddp_operator import __version__
from ddp_operator.api import crd
from ddp_operator.api.spec import Spec, SpecError, load_documents, other_kinds, parse_file, warnings
from ddp_operator.children import render


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
    failed = False
    for path in args.files:
        specs = _load(path)
        failed = failed or specs is None
        for spec in specs or []:
            print(
                f"{path}: {crd.KIND}/{spec.name}: valid ({spec.nodes} nodes × {spec.procs_per_node} "
                f"procs = {spec.world_size} ranks, {spec.device}/{spec.backend})"
            )
            found = (
                warnings(spec) + _script_warnings(spec, Path(path)) + _pod_security(spec, args.pod_security)
            )
            for warning in found:
                print(f"{path}: {crd.KIND}/{spec.name}: warning: {warning}", file=sys.stderr)
    return 1 if failed else 0


def _pod_security(spec: Spec, level: str | None) -> list[str]:
    """What Pod Security admission at ``level`` would refuse in the pods (none when no level is asked)."""
    from ddp_operator.api import podsecurity

    if level is None:
        return []
    pod = render.render_job(spec, 1)["spec"]["template"]["spec"]
    return podsecurity.violations(pod, level)


def _script_warnings(spec: Spec, path: Path) -> list[str]:
    """Scripts ``ddpjob local`` would not find (a warning: in a cluster the script is in the image)."""
    from ddp_operator.local import scripts

    return [
        f"{line}: `ddpjob local` would not find it (in a cluster it must be in the image)"
        for line in scripts.missing(spec, [Path.cwd(), path.resolve().parent])
    ]


def _render(args: argparse.Namespace) -> int:
    specs = _load(args.file)
    if specs is None:
        return 1
    documents = []
    for spec in specs:
        if args.namespace:
            spec = replace(spec, namespace=args.namespace)
        documents += render.render(spec, attempt=args.attempt)
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
            specs[0], workdir=Path(args.workdir), verbose=args.verbose, fresh=args.fresh, job_dir=job_dir
        )
    except processes.LocalError as exc:
        print(f"{args.file}: {crd.KIND}/{specs[0].name}: {exc}", file=sys.stderr)
        return run.EXIT_INVALID


def _operator(args: argparse.Namespace) -> int:
    from ddp_operator.runtime import heap

    if args.may_exec and (missing := heap.allocator_env(os.environ)):
        settings = " ".join(f"{key}={value}" for key, value in missing.items())
        message = (
            f"ddpjob operator: starting again with {settings}, so that memory freed after a burst of "
            "DDPJobs goes back to the system (set PYTHONMALLOC to choose otherwise)"
        )
        if args.json_logs:  # the fields of Kopf's JSON records: one object a line, from the first line
            now = datetime.datetime.now(datetime.UTC).isoformat()
            message = json.dumps({"message": message, "timestamp": now, "severity": "info"})
        print(message, file=sys.stderr, flush=True)
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **missing})
    import kopf

    from ddp_operator.runtime import handlers, keeper, opmetrics, peering

    log_format = kopf.LogFormat.JSON if args.json_logs else kopf.LogFormat.FULL
    kopf.configure(verbose=args.verbose, log_format=log_format)
    if not args.verbose:  # every event and timer tick would log a success line: keep what changed
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_successes)
    if args.node_health:
        from ddp_operator.observe import nodehealth

        try:
            rules = nodehealth.parse_rules(args.unhealthy_taints, args.unhealthy_conditions)
        except ValueError as exc:
            print(f"ddpjob operator: {exc}", file=sys.stderr)
            return 2
        handlers.enable_node_health(rules)
        conditions = ", ".join(f"{kind}={status}" for kind, status in rules.conditions)
        logging.getLogger("ddpjob.operator").info(
            "node health: a faulty rank's node is tainted %s; new attempts avoid nodes with taints %s or "
            "conditions %s",
            nodehealth.FAULTY_TAINT,
            ", ".join(rules.taints) or "(none)",
            conditions or "(none)",
        )
    from ddp_operator.observe import references
    from ddp_operator.runtime import reads

    reads.LOOK_UP_NAMESPACES = frozenset(args.check_references or ())
    logging.getLogger("ddpjob.operator").info(references.looked_up(args.check_references or ()))
    opmetrics.serve(args.metrics_port)
    namespaces = args.namespace or []
    standalone = args.standalone or _no_peering(namespaces)
    handlers.PEERING_LIFETIME_SECONDS = args.peering_lifetime
    own = peering.identity()
    priority = 0 if args.priority is None else args.priority
    if not standalone:
        if args.priority is None:  # auto: the first replica to announce itself acts
            priority = _claim(namespaces, own, args.peering_lifetime)
        logging.getLogger("ddpjob.operator").info(
            "peering as %s, priority %d, record lifetime %d s: the replica of highest priority acts, the "
            "others stand by and take over within %d s of its loss",
            own,
            priority,
            args.peering_lifetime,
            args.peering_lifetime,
        )
        handlers.KEEPER = keeper.Keeper(namespaces, own, priority, args.peering_lifetime)
        handlers.KEEPER.start()
    kopf.run(
        registry=kopf.get_default_registry(),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{args.liveness}/healthz",
        standalone=standalone,
        peering_name=None if standalone else peering.NAME,
        priority=priority,
        identity=own,  # type: ignore[arg-type]  # Kopf's Identity is a NewType of str
    )
    del handlers  # imported for its registrations
    return 0


def _claim(namespaces: list[str], own: str, lifetime: int) -> int:
    """:func:`ddp_operator.runtime.peering.claim`, or, where the API server does not let it, the priority
    by start time (the oldest replica acts), after saying so."""
    import kubernetes

    from ddp_operator.runtime import peering

    try:
        return peering.claim(namespaces, own, lifetime)
    except (kubernetes.client.exceptions.ApiException, OSError, RuntimeError) as exc:
        priority = peering.by_start_time()
        logging.getLogger("ddpjob.operator").warning(
            "could not claim a peering priority in %s (%s): priority %d by start time instead; two replicas "
            "started together may then both act until they see each other",
            peering.NAME,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            priority,
        )
        return priority


def _priority(text: str) -> int | None:
    """``--priority``: a number, or ``auto`` (``None``): claimed at start, :func:`ddp_operator.runtime.
    peering.claim`."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number or 'auto'") from None


def _no_peering(namespaces: list[str]) -> bool:
    """True (after a warning) when the peering object is absent: Kopf would wait for it in silence."""
    import kubernetes

    from ddp_operator.runtime import peering

    log = logging.getLogger("ddpjob.operator")
    try:
        absent = peering.missing(namespaces)
    except (OSError, kubernetes.config.ConfigException, kubernetes.client.exceptions.ApiException) as exc:
        log.warning(
            "cannot check for the peering object %s (%s); Kopf waits until it can read it and peer",
            peering.NAME,
            getattr(exc, "reason", None) or exc,
        )
        return False
    if absent:
        log.warning(peering.standalone_warning(absent))
    return bool(absent)


def _quiet_successes(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.endswith("' succeeded.") and message.startswith(("Handler '", "Timer '")))


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
        help="also warn about what a namespace enforcing this Pod Security level would refuse in the pods "
        "(pod-security.kubernetes.io/enforce), naming each field",
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
        help="discard the checkpoint of an earlier unfinished run instead of resuming",
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
    operate.add_argument(
        "--standalone",
        action="store_true",
        help="skip peering (only for a single replica without the KopfPeering CRDs)",
    )
    operate.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="peering priority among replicas: the highest acts, the others stand by; 'auto': claimed at "
        "start, the first replica to announce itself acts and each later one (a newer one, or one "
        "restarted) stands by behind those alive (default %(default)s)",
    )
    operate.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        help="seconds a replica's peering record lives without a keep-alive: a standby takes over this long "
        "after the acting replica died without a word (default %(default)s)",
    )
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
    operate.set_defaults(run=_operator)

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
