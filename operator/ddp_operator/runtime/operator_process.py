"""`ddpjob operator`: the operator process from its flags. Starts again on the allocator that gives memory
back, configures Kopf's logging, node health and the reference look-ups, serves the operator's metrics,
stands by until it holds ``--lease``, then runs Kopf, and releases the Lease once no reconcile writes any
more. The flags themselves, with their help, are :mod:`ddp_operator.cli`'s."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from typing import Any


def operate(args: argparse.Namespace) -> int:
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

    from ddp_operator.runtime import handlers, opmetrics

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
    for flag in ("priority", "peering_lifetime"):
        if getattr(args, flag) is not None:
            logging.getLogger("ddpjob.operator").warning(
                "--%s is ignored: Kopf's peering is gone; one replica acts while it holds --lease",
                flag.replace("_", "-"),
            )
    elector = None if args.standalone else _elector(args)
    if elector is False:
        return 2
    if elector is not None:
        if not _stand_by(elector, args.liveness):
            return 0  # stopped while standing by
        handlers.LEASE = elector
        elector.start()
    else:
        logging.getLogger("ddpjob.operator").warning(
            "no --lease: acting at once, without a Lease, so nothing stops a second operator on the same "
            "DDPJobs from acting beside this one (the chart passes --lease; by hand, pass the chart's, "
            "--lease=NAMESPACE/RELEASE-ddpjob-operator, to stand by behind it)"
        )
    try:
        kopf.run(
            registry=kopf.get_default_registry(),
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=f"http://{args.liveness}/healthz",
            standalone=True,  # one acting replica: the Lease's matter (runtime/lease.py), not Kopf's
        )
    finally:
        if elector is not None and handlers.settle():  # no reconcile writes any more, and none in flight
            elector.release()
        elif elector is not None:
            logging.getLogger("ddpjob.operator").warning(
                "a reconcile still ran 10 s after Kopf stopped: the Lease is not released, it expires"
            )
    del handlers  # imported for its registrations
    return 0


def _elector(args: argparse.Namespace) -> Any:
    """The :class:`~ddp_operator.runtime.lease.Elector` of ``--lease`` (None without it), or False after
    saying why its timing is refused."""
    from ddp_operator.runtime import lease

    if not args.lease:
        return None
    namespace, name = args.lease
    try:
        return lease.Elector(
            namespace,
            name,
            lease.identity(),
            duration=args.lease_duration,
            deadline=args.renew_deadline,
            retry=args.retry_period,
        )
    except ValueError as exc:
        print(f"ddpjob operator: {exc}", file=sys.stderr)
        return False


def _stand_by(elector: Any, liveness: str) -> bool:
    """Wait, serving ``/healthz`` meanwhile, until this process holds the Lease (True) or SIGTERM or
    SIGINT came first (False)."""
    import signal
    import threading

    from ddp_operator.runtime import lease

    stop = threading.Event()
    before = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = lease.serve_healthz(liveness)
    try:
        return bool(elector.acquire(stop))
    finally:
        server.shutdown()
        server.server_close()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _quiet_successes(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.endswith("' succeeded.") and message.startswith(("Handler '", "Timer '")))
