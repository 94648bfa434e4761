"""The Secrets and ConfigMaps a spec needs, looked up by the operator before any pod can say one is missing
(issue 46, item 3): which are looked up and when, how a missing one is said, and the decision it makes."""

from __future__ import annotations

import datetime as dt

from ddp_operator.decide import decision
from ddp_operator.observe import references, startup
from helpers.kubelet_pods import kubelet_pod
from helpers.reconciling import NOW, ddpjob_body, job_object, observed, pod_object, spec_of

NEEDS = {
    "envFrom": [
        {"secretRef": {"name": "s3-creds"}},
        {"configMapRef": {"name": "settings"}},
        {"secretRef": {"name": "maybe", "optional": True}},
    ],
    "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "token"}}}],
}


def _ready(plan: decision.Plan) -> dict[str, str]:
    return {c["type"]: c for c in plan.status["conditions"]}["Ready"]


def test_the_needed_ones_are_looked_up_once_each_and_only_until_the_pods_run() -> None:
    spec = spec_of(**NEEDS)
    wanted = (("Secret", "s3-creds"), ("ConfigMap", "settings"))  # the optional one is never needed
    for phase in ("", "Pending", "Restarting"):
        assert references.to_look_up(spec, phase) == wanted, phase
    for phase in ("Running", "Succeeded", "Failed", "Suspended"):
        assert references.to_look_up(spec, phase) == (), phase
    assert references.to_look_up(spec_of(), "") == ()


def test_a_missing_one_is_named_with_every_field_that_names_it_and_the_fix() -> None:
    spec = spec_of(**NEEDS)
    assert startup.absent(spec, set(), "job-1") is None
    assert startup.absent(spec, {("Secret", "maybe")}, "job-1") is None  # optional: the pods start without it
    one = startup.absent(spec, {("Secret", "s3-creds")}, "job-1")
    assert one is not None and one.final and one.reason == "ConfigError"
    assert one.said == (
        "Job job-1: NotFound: Secret s3-creds (spec.envFrom[0].secretRef, "
        "spec.env[0].valueFrom.secretKeyRef) does not exist in namespace ns; it will not fix itself: "
        "create it in namespace ns, or correct the name; the pods start once it exists"
    )
    two = startup.absent(spec, {("Secret", "s3-creds"), ("ConfigMap", "settings")}, "job-1")
    assert two is not None and "ConfigMap settings (spec.envFrom[1].configMapRef) do not exist" in two.said
    assert "create them in namespace ns" in two.said


def test_the_job_is_created_all_the_same_and_the_status_says_what_is_missing() -> None:
    """Before any pod exists the status names the Secret (Pending, ConfigError, a Warning event), and the
    Service and Job are created: the Secret may come later, and the kubelet then starts the pods."""
    plan = decision.decide(observed(ddpjob_body(**NEEDS), [], [], NOW, missing={("Secret", "s3-creds")}))
    assert plan.create_job is not None and plan.create_service is not None
    assert plan.status["phase"] == "Pending"
    ready = _ready(plan)
    assert (ready["status"], ready["reason"]) == ("False", "ConfigError")
    assert "Secret s3-creds (spec.envFrom[0].secretRef" in ready["message"]
    assert ("Warning", "ConfigError") in [(e.type, e.reason) for e in plan.events]


def test_pending_pods_say_it_once_and_when_it_exists_the_job_goes_on_with_no_restart() -> None:
    body = ddpjob_body({"phase": "Pending", "attempt": 1}, **NEEDS)
    pods = [
        pod_object(1, 0, phase="Pending", ready=False),
        pod_object(1, 1, phase="Pending", ready=False),
    ]  # not scheduled yet
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW, missing={("ConfigMap", "settings")}))
    ready = _ready(plan)
    assert (
        ready["reason"] == "ConfigError"
        and "ConfigMap settings (spec.envFrom[1].configMapRef)" in ready["message"]
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ConfigError")]
    later = NOW + dt.timedelta(minutes=30)
    again = decision.decide(
        observed(
            {**body, "status": plan.status}, [job_object(1)], pods, later, missing={("ConfigMap", "settings")}
        )
    )
    assert again.events == () and again.delete_jobs == () and again.create_job is None
    created = decision.decide(observed({**body, "status": plan.status}, [job_object(1)], pods, later))
    assert _ready(created)["reason"] != "ConfigError" and created.status["attempt"] == 1


def test_the_kubelets_own_words_come_first() -> None:
    """A pod whose kubelet says why it cannot start is named with its words, not the look-up's."""
    waiting = ("CreateContainerConfigError", 'secret "s3-creds" not found')
    pods = [kubelet_pod(0, waiting=waiting)]
    body = ddpjob_body({"phase": "Pending", "attempt": 1}, **NEEDS)
    plan = decision.decide(observed(body, [job_object(1)], pods, NOW, missing={("Secret", "s3-creds")}))
    assert "CreateContainerConfigError" in _ready(plan)["message"]


def test_the_start_up_line_says_where_references_are_looked_up_and_where_the_kubelet_says_them() -> None:
    """One info line at start: by default (no --check-references) the kubelet's reasons only; else the
    namespaces looked up, each once, sorted."""
    default = references.looked_up(())
    assert "kubelet's reasons only" in default and "reads no Secret or ConfigMap" in default
    assert "checkReferences.namespaces" in default  # what the opt-in would give
    opted = references.looked_up(["team-b", "team-a", "team-b"])
    assert "namespaces team-a, team-b before the pods start" in opted and "kubelet's reasons" in opted


def test_a_refused_look_up_names_the_kind_the_namespace_and_the_grant() -> None:
    said = references.refused("ConfigMap", "team-a", "403 Forbidden")
    assert said.startswith("cannot look up configmaps in namespace team-a (403 Forbidden)")
    assert "checkReferences.namespaces" in said
