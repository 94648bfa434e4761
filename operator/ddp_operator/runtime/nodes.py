"""The operator's writes on Nodes (``--node-health``; the chart's ``nodeHealth.enabled`` grants them):
where the compute probe found a faulty rank, a taint, a Node condition and an Event. What is written is
:mod:`ddp_operator.observe.nodehealth`'s; this is the I/O edge.

A write that fails (the node is gone, the grant is missing) is said in the operator's log and as a Warning
Event on the DDPJob, and does not stop the reconcile: the job's own restart away from the node
(``status.probe.faultyNodes``) does not depend on it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from ddp_operator.observe import nodehealth
from ddp_operator.runtime.reads import api_client

log = logging.getLogger("ddpjob.operator.nodes")
EVENT_NAMESPACE = "default"
"""Where Events about a Node go (cluster-scoped objects' events: the kubelet's go there too)."""
CONFLICT_RETRIES = 3


def mark_faulty(node: str, device: str, message: str, source: str) -> str | None:
    """Taint ``node`` for ``device``, set its condition and post an Event (``source``: the DDPJob, by
    namespace/name). None when done, else what failed, for a person."""
    core = kubernetes.client.CoreV1Api(api_client())
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        tainted = _taint(core, node, device)
        condition = nodehealth.faulty_condition(f"{source}: {message}", now)
        core.patch_node_status(node, {"status": {"conditions": [condition]}})
        taint = nodehealth.faulty_taint(device)
        said = f"{taint['key']}={taint['value']}:{taint['effect']}" + ("" if tainted else " (already there)")
        _event(
            core, node, now, f"{source}: {message}; tainted {said}: no DDPJob lands here until it is removed"
        )
        log.warning("node %s: tainted %s after %s found a faulty rank there", node, said, source)
        return None
    except ApiException as exc:
        why = f"cannot mark node {node} faulty: {exc.status} {exc.reason}"
        if exc.status == 403:
            why += " (the operator's nodeHealth grant is missing: install the chart with nodeHealth.enabled)"
        log.warning(why)
        return why


def clear_condition(node: str) -> None:
    """Set our condition False on ``node``, whose taint a person removed (a failure is logged: the next
    event of the node tries again)."""
    core = kubernetes.client.CoreV1Api(api_client())
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        core.patch_node_status(node, {"status": {"conditions": [nodehealth.cleared_condition(now)]}})
        log.info("node %s: %s set False (its taint was removed)", node, nodehealth.FAULTY_CONDITION)
    except ApiException as exc:
        log.warning(
            "node %s: cannot set %s False: %s %s", node, nodehealth.FAULTY_CONDITION, exc.status, exc.reason
        )


def _taint(core: Any, node: str, device: str) -> bool:
    """Add the taint (read, then write with the read's resourceVersion: taints are one list, a merge patch
    replaces it whole); False when it was there already."""
    for _ in range(CONFLICT_RETRIES):
        body = core.read_node(node)
        # the API's field names (timeAdded, which a NoExecute taint's eviction counts from), not the
        # client model's (to_dict: time_added, which the server would drop)
        taints = core.api_client.sanitize_for_serialization(body.spec.taints or [])
        added = nodehealth.with_faulty_taint(taints, device)
        if added is None:
            return False
        patch = {"metadata": {"resourceVersion": body.metadata.resource_version}, "spec": {"taints": added}}
        try:
            core.patch_node(node, patch)
            return True
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise ApiException(status=409, reason=f"Conflict: node {node} changed {CONFLICT_RETRIES} times meanwhile")


def _event(core: Any, node: str, now: str, message: str) -> None:
    meta: Mapping[str, Any] = {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE}
    event = {
        "metadata": meta,
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": nodehealth.FAULTY_REASON,
        "message": message[:1000],
        "type": "Warning",
        "source": {"component": "ddpjob-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    core.create_namespaced_event(EVENT_NAMESPACE, event)
