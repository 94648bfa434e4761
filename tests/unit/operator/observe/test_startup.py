"""A pod that cannot start, read as the kubelet writes it (``state.waiting.reason`` and ``message`` of a
container or an init container): the pod, the container, the kubelet's words verbatim, whether the cause
is final in this attempt, and the fix naming the spec's field (observe/startup.py)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ddp_operator.api import names, reasons
from ddp_operator.api.spec import parse
from ddp_operator.observe import facts, mounts, startup
from ddp_operator.observe.references import Reference, references
from ddp_operator.observe.startup import first_failure
from ddp_operator.runtime import handlers, reads
from helpers.kubelet_pods import IMAGE, MOUNT_NOT_FOUND, NOT_FOUND, failed_mount, kubelet_pod, mounting_pod

REFS = (
    Reference("Secret", "s3-creds", "spec.envFrom[0].secretRef"),
    Reference("ConfigMap", "settings", "spec.envFrom[1].configMapRef"),
    Reference("Secret", "db", "spec.env[0].valueFrom.secretKeyRef"),
)

# name → (waiting (reason, message), job reason, final, words the fix must hold)
CASES: dict[str, tuple[tuple[str, str], str, bool, list[str]]] = {
    "a misspelled image (containerd: not found)": (
        ("ErrImagePull", NOT_FOUND),
        "ErrImagePull",
        True,
        [f"the registry has no image {IMAGE}", "push it", "correct spec.image", "apply it again"],
    ),
    "the back-off after it (kubelet 1.32 on: the last error in the message)": (
        ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: {NOT_FOUND}'),
        "ImagePullBackOff",
        True,
        ["has no image", "spec.image"],
    ),
    "the back-off before 1.32 (no error in the message)": (
        ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
        "ImagePullBackOff",
        False,
        ["retries the pull", "reach the registry", "spec.image"],
    ),
    "Docker Hub: no such repository, or private": (
        (
            "ErrImagePull",
            f'failed to pull and unpack image "docker.io/{IMAGE}": failed to resolve reference '
            f'"docker.io/{IMAGE}": pull access denied, repository does not exist or may require '
            "authorization: server message: insufficient_scope: authorization failed",
        ),
        "ErrImagePull",
        True,
        ["refuses", "check spec.image", "spec.podTemplate.imagePullSecrets"],
    ),
    "a private registry without credentials": (
        (
            "ErrImagePull",
            'rpc error: code = Unknown desc = failed to pull and unpack image "registry.example.com/t/x:1": '
            "unexpected status from HEAD request to https://registry.example.com/v2/t/x/manifests/1: "
            "401 Unauthorized",
        ),
        "ErrImagePull",
        True,
        ["refuses", "imagePullSecrets"],
    ),
    "a registry out of reach (retried)": (
        (
            "ErrImagePull",
            'rpc error: code = DeadlineExceeded desc = failed to pull and unpack image "registry.example.com'
            '/t/x:1": failed to do request: Head "https://registry.example.com/v2/t/x/manifests/1": dial tcp '
            "10.0.0.9:443: i/o timeout",
        ),
        "ErrImagePull",
        False,
        ["retries"],
    ),
    "an image reference that does not parse": (
        (
            "InvalidImageName",
            'Failed to apply default image tag "ddpjob/Trainer:0.1.0": couldn\'t parse image reference '
            '"ddpjob/Trainer:0.1.0": invalid reference format: repository name must be lowercase',
        ),
        "InvalidImageName",
        True,
        ["not a valid image reference", "correct spec.image"],
    ),
    "envFrom names a Secret that is absent": (
        ("CreateContainerConfigError", 'secret "s3-creds" not found'),
        "ConfigError",
        True,
        ["create Secret s3-creds (spec.envFrom[0].secretRef) in namespace team-a", "start once it exists"],
    ),
    "envFrom names a ConfigMap that is absent": (
        ("CreateContainerConfigError", 'configmap "settings" not found'),
        "ConfigError",
        True,
        ["create ConfigMap settings (spec.envFrom[1].configMapRef) in namespace team-a"],
    ),
    "a Secret the spec does not name (still absent: final)": (
        ("CreateContainerConfigError", 'secret "other" not found'),
        "ConfigError",
        True,
        ["create Secret other in namespace team-a"],
    ),
    "a key missing from a Secret": (
        ("CreateContainerConfigError", "couldn't find key PASSWORD in Secret team-a/db"),
        "ConfigError",
        True,
        ["add key PASSWORD to Secret db (spec.env[0].valueFrom.secretKeyRef), or correct the key"],
    ),
    "a root image under runAsNonRoot": (
        (
            "CreateContainerConfigError",
            'container has runAsNonRoot and image will run as root (pod: "job-1-0-x7k2p_team-a(…)", '
            "container: trainer)",
        ),
        "ConfigError",
        True,
        ["runAsUser", "USER is not root"],
    ),
    "a config error without a message (the test cluster's node agent)": (
        ("CreateContainerConfigError", ""),
        "ConfigError",
        False,
        ["kubectl describe pod job-1-0-x7k2p -n team-a"],
    ),
    "the runtime cannot create the container": (
        (
            "CreateContainerError",
            'failed to generate container "abc" spec: failed to mkdir "/data": mkdir /data: '
            "read-only file system",
        ),
        "ContainerError",
        False,
        ["the kubelet retries", "kubectl describe pod"],
    ),
    "the runtime cannot start it": (
        (
            "RunContainerError",
            "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc "
            'create failed: unable to start container process: exec: "pythn": executable file not found in '
            "$PATH: unknown",
        ),
        "ContainerError",
        False,
        ["could not start it", "kubectl describe pod job-1-0-x7k2p -n team-a"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_kubelet_reason_is_named_with_its_words_and_the_fix(case: str) -> None:
    waiting, reason, final, words = CASES[case]
    found = first_failure([kubelet_pod(waiting=waiting)], REFS)
    assert found is not None
    assert (found.pod, found.container, found.init) == ("job-1-0-x7k2p", "trainer", False)
    assert (found.waiting, found.message, found.reason, found.final) == (
        waiting[0],
        waiting[1],
        reason,
        final,
    )
    for word in words:
        assert word in found.fix, (word, found.fix)
    said = found.said
    assert said.startswith(f"pod job-1-0-x7k2p container trainer: {waiting[0]}")
    assert waiting[1] in said and found.fix in said
    assert ("it will not fix itself" in said) == final


def test_an_init_container_is_named_as_one_and_the_sync_hooks_fix_says_its_switch() -> None:
    pod = kubelet_pod(
        init_waiting=(
            "ImagePullBackOff",
            f'Back-off pulling image "ddpjob/trainer:0.1.0": ErrImagePull: {NOT_FOUND}',
        )
    )
    found = first_failure([pod])
    assert found is not None and found.init and found.container == names.SYNC_HOOK_INIT_CONTAINER
    assert found.said.startswith(f"pod job-1-0-x7k2p init container {names.SYNC_HOOK_INIT_CONTAINER}: ")
    assert "spec.syncCheck.autoInstrument: false" in found.fix and found.subject == "ddpjob/trainer:0.1.0"
    mine = first_failure([kubelet_pod(init="fetch-data", init_waiting=("InvalidImageName", "bad"))])
    assert mine is not None and "init container fetch-data (spec.podTemplate.initContainers)" in mine.fix


def test_nothing_is_said_while_containers_are_only_being_created_or_pods_run() -> None:
    assert first_failure([kubelet_pod(), kubelet_pod(1)]) is None  # ContainerCreating, PodInitializing
    running = kubelet_pod()
    running["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-11-22T12:00:00Z"}}
    assert first_failure([running]) is None


def test_the_first_pod_by_completion_index_is_named_and_a_deleted_pod_is_not() -> None:
    missing = ("CreateContainerConfigError", 'secret "s3-creds" not found')
    pods = [kubelet_pod(1, waiting=missing), kubelet_pod(0)]
    assert (found := first_failure(pods)) is not None and found.pod == "job-1-1-x7k2p"
    pods.append(kubelet_pod(0, waiting=("ErrImagePull", NOT_FOUND)))
    assert (found := first_failure(pods)) is not None and found.pod == "job-1-0-x7k2p"
    pods[-1]["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    assert (found := first_failure(pods)) is not None and found.pod == "job-1-1-x7k2p"


def test_the_pod_as_the_operators_index_keeps_it_is_enough() -> None:
    """The index keeps a pod's status but not its spec: the image comes from the container's status."""
    found = first_failure([handlers.slim_pod(kubelet_pod(waiting=("ErrImagePull", NOT_FOUND)))])
    assert found is not None and found.subject == IMAGE and f"no image {IMAGE}" in found.fix


def test_a_pull_and_its_back_off_are_one_cause() -> None:
    assert {*startup.REASONS.values(), reasons.MOUNT_FAILED} == set(reasons.STARTUP_REASONS)
    assert startup.same_cause("ErrImagePull", "ImagePullBackOff")
    assert startup.same_cause("ConfigError", "ConfigError")
    assert not startup.same_cause("ConfigError", "ImagePullBackOff")


def test_the_facts_carry_the_current_attempts_failure_only() -> None:
    missing = ("CreateContainerConfigError", 'secret "s3-creds" not found')
    old = kubelet_pod(waiting=missing, attempt=1)
    seen = facts.observe({"attempt": 2}, [], [old, kubelet_pod(attempt=2)], references=REFS)
    assert seen.attempt == 2 and seen.startup is None
    seen = facts.observe({"attempt": 1}, [], [old], references=REFS)
    assert seen.startup is not None and "spec.envFrom[0].secretRef" in seen.startup.fix


def test_every_secret_and_config_map_the_spec_names_is_listed_with_its_field() -> None:
    doc = {
        "apiVersion": "ddpjob.io/v1alpha1",
        "kind": "DDPJob",
        "metadata": {"name": "job", "namespace": "team-a"},
        "spec": {
            "nodes": 2,
            "device": "cpu",
            "envFrom": [
                {"secretRef": {"name": "s3-creds"}},
                {"configMapRef": {"name": "settings", "optional": True}},
            ],
            "env": [
                {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
            ],
            "checkpoint": {"s3": {"bucket": "ckpt", "credentialsSecret": {"name": "bucket-creds"}}},
            "podTemplate": {
                "imagePullSecrets": [{"name": "registry"}],
                "volumes": [
                    {"name": "certs", "secret": {"secretName": "tls"}},
                    {"name": "cfg", "projected": {"sources": [{"configMap": {"name": "extra"}}]}},
                ],
            },
        },
    }
    listed = {(ref.kind, ref.name, ref.field, ref.optional) for ref in references(parse(doc))}
    assert listed == {
        ("Secret", "s3-creds", "spec.envFrom[0].secretRef", False),
        ("ConfigMap", "settings", "spec.envFrom[1].configMapRef", True),
        ("Secret", "db", "spec.env[0].valueFrom.secretKeyRef", False),
        ("Secret", "bucket-creds", "spec.checkpoint.s3.credentialsSecret", False),
        ("Secret", "registry", "spec.podTemplate.imagePullSecrets[0]", False),
        ("Secret", "tls", "spec.podTemplate.volumes[0].secret", False),
        ("ConfigMap", "extra", "spec.podTemplate.volumes[1].projected.sources[0].configMap", False),
    }
    assert str(Reference("Secret", "s3-creds", "spec.envFrom[0].secretRef")) == (
        "Secret s3-creds (spec.envFrom[0].secretRef)"
    )


def test_a_named_pull_secret_is_what_the_fix_asks_to_check() -> None:
    refused = ("ErrImagePull", "failed to pull: 401 Unauthorized")
    found = first_failure(
        [kubelet_pod(waiting=refused)],
        (Reference("Secret", "registry", "spec.podTemplate.imagePullSecrets[0]"),),
    )
    assert found is not None and found.final
    assert "check that Secret registry (spec.podTemplate.imagePullSecrets[0]) exists" in found.fix


# -- a volume that cannot mount: no container waits with a reason; the kubelet's FailedMount events say it --

SUMMARY = (
    "Unable to attach or mount volumes: unmounted volumes=[checkpoint], unattached volumes=[checkpoint dshm "
    "kube-api-access-x]: timed out waiting for the condition"
)


def test_the_pods_whose_volumes_wait_are_the_ones_read() -> None:
    now = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
    fresh = mounting_pod(1, scheduled="2026-11-22T11:59:55Z")  # 5 s: a mount that works takes less
    started = kubelet_pod(2)  # its sandbox is made (pulling, creating): not a mount's wait
    gone = mounting_pod(3)
    gone["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    old_kubelet = mounting_pod(4)  # before 1.29: no PodReadyToStartContainers, nothing to go by
    old_kubelet["status"]["conditions"] = old_kubelet["status"]["conditions"][1:]
    assert mounts.pods_to_read([mounting_pod(0), fresh, started, gone, old_kubelet], now) == (
        "job-1-0-x7k2p",
    )


def test_a_missing_secret_for_a_volume_is_named_from_the_kubelets_event() -> None:
    refs = (Reference("Secret", "bucket-creds", "spec.checkpoint.s3.credentialsSecret"),)
    events = [failed_mount(SUMMARY, at="2026-11-22T11:59:50Z"), failed_mount(MOUNT_NOT_FOUND)]
    found = mounts.failure(events, [mounting_pod(0)], refs)
    assert found is not None and (found.reason, found.waiting, found.final) == (
        "FailedMount",
        "FailedMount",
        True,
    )
    assert found.said == (
        f"pod job-1-0-x7k2p: FailedMount: {MOUNT_NOT_FOUND}; it will not fix itself: create Secret "
        "bucket-creds (spec.checkpoint.s3.credentialsSecret) in namespace team-a, or correct the name; the "
        "pods start once it exists"
    )
    other = mounts.failure(
        [failed_mount('MountVolume.SetUp failed for volume "data" : mount failed: exit 32')],
        [mounting_pod(0)],
    )
    assert other is not None and not other.final and "kubectl describe pod job-1-0-x7k2p" in other.fix
    assert mounts.failure([failed_mount(MOUNT_NOT_FOUND, pod="someone-else")], [mounting_pod(0)]) is None
    seen = facts.observe({"attempt": 1}, [], [mounting_pod(0)], references=refs, mount_events=events)
    assert seen.startup == found


class _Events:
    """CoreV1Api's list_namespaced_event, as the runtime calls it; counts the calls, can refuse."""

    def __init__(self, items: list[dict[str, Any]], status: int = 0) -> None:
        self.items, self.status = items, status
        self.calls: list[tuple[str, str]] = []

    def __call__(self, _client: Any = None) -> _Events:
        return self

    def list_namespaced_event(self, namespace: str, field_selector: str, _preload_content: bool) -> Any:
        self.calls.append((namespace, field_selector))
        if self.status:
            raise ApiException(status=self.status, reason="Forbidden")
        return type("Response", (), {"data": json.dumps({"items": self.items})})()


def test_the_runtime_lists_failed_mounts_only_while_a_pods_volumes_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
    body = {"metadata": {"name": "job", "namespace": "team-a"}, "status": {"phase": "Pending"}}
    api = _Events([failed_mount(MOUNT_NOT_FOUND), failed_mount(MOUNT_NOT_FOUND, pod="someone-else")])
    monkeypatch.setattr(reads, "api_client", lambda: None)
    monkeypatch.setattr(reads.kubernetes.client, "CoreV1Api", api)
    assert reads.read_events(body, [], [kubelet_pod(0)], now) == () and api.calls == []  # nothing waits
    found = reads.read_events(body, [], [mounting_pod(0)], now)
    assert [e["involvedObject"]["name"] for e in found] == ["job-1-0-x7k2p"]
    assert api.calls == [("team-a", "involvedObject.kind=Pod,reason=FailedMount")]
    finished = {**body, "status": {"phase": "Succeeded"}}
    assert reads.read_events(finished, [], [mounting_pod(0)], now) == ()
    monkeypatch.setattr(reads.kubernetes.client, "CoreV1Api", _Events([], status=403))
    assert reads.read_events(body, [], [mounting_pod(0)], now) == ()  # an older chart: no reading, no failure
