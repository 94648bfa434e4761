"""Pods talk to the API server as in a real cluster: the node agent projects the ServiceAccount token, the
CA and the namespace at /var/run/secrets/kubernetes.io/serviceaccount, sets ``KUBERNETES_SERVICE_HOST`` and
``PORT`` to the ``kubernetes`` Service, whose ClusterIP it proxies to the API server; a container of an
upstream monitoring image runs the binary built for it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testcluster import images
from testcluster.fixtures import Cluster, python_pod, wait_for
from testcluster.images import container_argv
from testcluster.projected import Sources, volume_files
from testcluster.serviceproxy import master_service_env
from testcluster.volumes import VolumeError

WHO_AM_I = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
if not os.path.exists(sa + "/token"):
    open(os.environ["DDPJOB_TERMINATION_LOG"], "w").write("no token")
    raise SystemExit(1)
token = open(sa + "/token").read()
url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
request = urllib.request.Request(
    url + "/apis/authentication.k8s.io/v1/selfsubjectreviews", data=json.dumps(review).encode(),
    headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"},
)
context = ssl.create_default_context(cafile=sa + "/ca.crt")
with urllib.request.urlopen(request, context=context, timeout=10) as response:
    user = json.load(response)["status"]["userInfo"]
said = {"user": user["username"], "pod": user["extra"]["authentication.kubernetes.io/pod-name"][0],
        "namespace": open(sa + "/namespace").read(), "url": url}
open(os.environ["DDPJOB_TERMINATION_LOG"], "w").write(json.dumps(said))
"""


def _finished(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The terminated state of the pod's one container, once the pod has finished."""

    def done() -> dict[str, Any] | None:
        status = cluster.pod(namespace, name)["status"]
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    state: dict[str, Any] = wait_for(done, what=f"pod {name} to finish", timeout=90)["containerStatuses"][0]
    return dict(state["state"]["terminated"])


@pytest.mark.cluster
def test_a_pod_reaches_the_api_server_with_its_projected_token(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(python_pod("who", WHO_AM_I)))
    opted_out = python_pod("anonymous", WHO_AM_I, automountServiceAccountToken=False)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(opted_out))
    said = json.loads(_finished(cluster, namespace, "who")["message"])
    assert said == {
        "user": f"system:serviceaccount:{namespace}:default",
        "pod": "who",
        "namespace": namespace,
        "url": "https://10.96.0.1:443",
    }
    terminated = _finished(cluster, namespace, "anonymous")
    assert (terminated["exitCode"], terminated["message"].strip()) == (1, "no token")


DOCKERFILE = """
FROM python:3.11-slim AS base
CMD ["python3"]
FROM base AS tool
ENTRYPOINT ["tool"]
CMD ["serve", "--port=1"]
FROM tool AS child
FROM base AS plain
"""


def test_upstream_monitoring_images_run_the_binaries_built_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "monitoring_bin", lambda: "/built")
    run = container_argv(
        {"image": "quay.io/prometheus/prometheus:v3.5.0", "args": ["--web.listen-address=:9090"]}
    )
    assert (run["command"], run["args"]) == (["/built/prometheus"], ["--web.listen-address=:9090"])
    run = container_argv(
        {
            "image": "quay.io/prometheus-operator/prometheus-operator@sha256:ab",
            "command": ["/bin/operator", "-x"],
        }
    )
    assert run["command"] == ["/built/operator", "-x"]  # named by its path in the image
    own = {"image": "quay.io/prometheus/alertmanager:v0.28.1", "command": ["sh"]}
    assert container_argv(own) == own  # a command of the pod's own replaces the ENTRYPOINT
    project = {"image": "ddpjob/trainer:0.1.0", "args": ["--help"]}
    assert container_argv(project) == project  # the project's images run on the real nodes only
    monkeypatch.setattr(images, "monitoring_bin", lambda: None)
    assert "command" not in container_argv({"image": "quay.io/prometheus/prometheus:v3.5.0"})


def test_master_service_env_is_the_kubelets() -> None:
    service = {
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}
    }
    assert master_service_env(service) == {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443",
        "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
    }
    assert master_service_env(None) == {}


def test_projected_volume_files() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"serviceAccountName": "sa"}}
    asked: list[tuple[str, int, str | None]] = []

    def token(account: str, seconds: int, audience: str | None) -> str:
        asked.append((account, seconds, audience))
        return "TOKEN"

    sources = Sources(
        config_map=lambda ns, name: (
            {"ca.crt": "CA", "other": "x"} if (ns, name) == ("ns", "kube-root-ca.crt") else None
        ),
        secret=lambda ns, name: None,
        token=token,
    )
    volume = {
        "name": "kube-api-access-x",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ]
        },
    }
    assert volume_files(pod, volume, sources) == {"token": "TOKEN", "ca.crt": "CA", "namespace": "ns"}
    assert asked == [("sa", 3607, None)]
    with pytest.raises(VolumeError, match="secret 'creds' not found"):
        volume_files(pod, {"name": "s", "secret": {"secretName": "creds"}}, sources)
    assert (
        volume_files(pod, {"name": "s", "secret": {"secretName": "creds", "optional": True}}, sources) == {}
    )
