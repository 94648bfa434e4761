"""Pod Security Standards offline (``api.pod_security_standards``: what `ddpjob validate --pod-security`
says) and the API server's refusal read back (``observe.refused_pods``): each finding names the DDPJob
field."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_operator.api import pod_security_standards
from ddp_operator.api.spec import parse, parse_file
from ddp_operator.children import render
from ddp_operator.decide import decision
from ddp_operator.observe.refused_pods import failure, jobs_to_read
from helpers.reconciling import observed

REPO = Path(__file__).resolve().parents[4]
NOW = dt.datetime(2026, 11, 28, 12, 0, 0, tzinfo=dt.UTC)
BREAKS = {
    "hostNetwork": True,
    "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    "initContainers": [{"name": "prep", "image": "busybox"}],
    "volumes": [{"name": "data", "hostPath": {"path": "/data"}}],
    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
}
# the Job controller's FailedCreate message, in the form the test cluster's API server (1.34) gives it
# (tests/e2e/test_real_nodes.py reads the real one)
REFUSAL = (
    'Error creating: pods "psa-1-0-x2x9k" is forbidden: violates PodSecurity "restricted:latest": host '
    'namespaces (hostNetwork=true), allowPrivilegeEscalation != false (container "trainer" must set '
    "securityContext.allowPrivilegeEscalation=false)"
)


def _doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "psa", "namespace": "ml"},
        "spec": {"nodes": 2, "device": "cpu", **spec},
    }


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = render.render_job(parse(doc), 1)["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_passes_restricted(example: Path) -> None:
    """What ddpjob renders (non-root, seccomp RuntimeDefault, no escalation, no capability), the sync hook's
    init container included, passes the strictest level."""
    for spec in parse_file(example):
        pod = render.render_job(spec, 1)["spec"]["template"]["spec"]
        assert pod_security_standards.violations(pod, "restricted") == [], example


def test_each_control_a_field_breaks_names_the_field() -> None:
    pod = _pod(_doc(command=["torchrun"], args=["t.py"], podTemplate=BREAKS))
    baseline = pod_security_standards.violations(pod, "baseline")
    assert baseline == [
        'spec.podTemplate.hostNetwork: true is not allowed under Pod Security "baseline" (host namespaces)',
        "spec.podTemplate.containerSecurityContext.capabilities.add: IPC_LOCK is not allowed under Pod "
        'Security "baseline" (accepted: AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, '
        "NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT)",
        "spec.podTemplate.volumes (data): hostPath is not allowed under Pod Security "
        '"baseline" (use a claim)',
    ]
    restricted = pod_security_standards.violations(pod, "restricted")
    fields = [line.split(":")[0].split(" ")[0] for line in restricted]
    assert fields == [
        "spec.podTemplate.hostNetwork",
        "spec.podTemplate.volumes",
        "spec.podTemplate.initContainers[0].securityContext.allowPrivilegeEscalation",
        "spec.podTemplate.initContainers[0].securityContext.capabilities.drop",
        "spec.podTemplate.containerSecurityContext.capabilities.drop",
        "spec.podTemplate.containerSecurityContext.capabilities.add",
    ], restricted
    assert pod_security_standards.violations(pod, "privileged") == []
    with pytest.raises(ValueError, match="expected one of privileged, baseline, restricted"):
        pod_security_standards.violations(pod, "strict")
    root = _pod(_doc(podTemplate={"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}))
    said = pod_security_standards.violations(root, "restricted")
    assert [line.split(":")[0] for line in said] == [
        "spec.podTemplate.securityContext.runAsUser",
        "spec.podTemplate.securityContext.runAsNonRoot",
    ], said  # the trainer container's own runAsNonRoot (true, ddpjob's) stands


def _job() -> dict[str, Any]:
    job = render.render_job(parse(_doc(podTemplate={"hostNetwork": True})), 1)
    job["metadata"]["creationTimestamp"] = "2026-11-28T11:59:50Z"
    return job


def _event(job: str, message: str = REFUSAL, reason: str = "FailedCreate") -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": "Job", "name": job},
        "lastTimestamp": "2026-11-28T11:59:58Z",
    }


def test_the_api_servers_refusal_is_read_from_a_job_without_pods_and_names_the_fields() -> None:
    job = _job()
    assert jobs_to_read([job], [], NOW) == ("psa-1",)
    assert jobs_to_read([job], [], NOW - dt.timedelta(seconds=8)) == (), "just created: not yet"
    started = {"metadata": {"labels": dict(job["spec"]["template"]["metadata"]["labels"])}}
    assert jobs_to_read([job], [started], NOW) == (), "its pods exist: nothing was refused"
    pod = job["spec"]["template"]["spec"]
    found = failure([_event("other-1"), _event("psa-1")], "psa-1", "ml", pod)
    assert found is not None and (found.reason, found.final, found.waiting) == (
        "PodSecurity",
        True,
        "FailedCreate",
    )
    assert found.message == REFUSAL
    assert found.said.startswith(f"Job psa-1: FailedCreate: {REFUSAL}; it will not fix itself: ")
    assert 'spec.podTemplate.hostNetwork: true is not allowed under Pod Security "restricted"' in found.fix
    assert "pod-security.kubernetes.io/enforce=restricted on namespace ml" in found.fix
    quota = [_event("psa-1", message="exceeded quota: compute")]
    assert failure(quota, "psa-1", "ml", pod) is None, "quota: it waits"


def test_a_refused_job_is_pending_with_the_reason_and_the_fields_and_is_never_restarted() -> None:
    job = _job()
    del job["spec"]["template"]  # as the operator's index keeps a Job
    body = {**_doc(podTemplate={"hostNetwork": True}), "status": {"phase": "Pending", "attempt": 1}}
    body["metadata"]["generation"] = 1
    plan = decision.decide(observed(body, [job], [], NOW, mount_events=[_event("psa-1")]))
    assert (plan.status["phase"], plan.delete_jobs, plan.create_job) == ("Pending", (), None)
    ready = {c["type"]: c for c in plan.status["conditions"]}["Ready"]
    assert ready["reason"] == "PodSecurity" and "spec.podTemplate.hostNetwork" in ready["message"], ready
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "PodSecurity")]


def test_validate_warns_offline_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_doc(podTemplate={"hostNetwork": True})))
    cmd = [sys.executable, "-m", "ddp_operator", "validate", "--pod-security", "restricted", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr  # a warning: the namespace may enforce less
    assert 'warning: spec.podTemplate.hostNetwork: true is not allowed under Pod Security "restricted"' in (
        done.stderr
    )
    quiet = subprocess.run(
        [*cmd[:-1], str(REPO / "examples" / "no-code.yaml")], capture_output=True, text=True
    )
    assert quiet.returncode == 0 and "Pod Security" not in quiet.stderr, quiet.stderr


class _Events:
    """CoreV1Api's event list, as the API server answers it."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items, self.calls = items, []  # type: ignore[var-annotated]

    def __call__(self, _client: Any = None) -> _Events:
        return self

    def list_namespaced_event(self, namespace: str, field_selector: str, _preload_content: bool) -> Any:
        self.calls.append((namespace, field_selector))
        return type("Response", (), {"data": json.dumps({"items": self.items})})()


def test_the_runtime_lists_failed_creates_only_while_a_job_has_no_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ddp_operator.runtime import reads

    job = _job()
    api = _Events([_event("psa-1"), _event("someone-else-1")])
    monkeypatch.setattr(reads, "api_client", lambda: None)
    monkeypatch.setattr(reads.kubernetes.client, "CoreV1Api", api)
    body = {"metadata": {"name": "psa", "namespace": "ml"}, "status": {"phase": "Pending"}}
    found = reads.read_events(body, [job], [], NOW)
    assert [e["involvedObject"]["name"] for e in found] == ["psa-1"]
    assert api.calls == [("ml", "involvedObject.kind=Job,reason=FailedCreate")]
    pod = {"metadata": {"labels": dict(job["spec"]["template"]["metadata"]["labels"])}}
    assert reads.read_events(body, [job], [pod], NOW) == () and len(api.calls) == 1  # its pods exist
