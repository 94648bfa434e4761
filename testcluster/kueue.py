"""Kueue on the test cluster: its release's controller and CRDs, its webhooks reachable by the API server.

``hack/cluster/kueue.sh`` builds ``sigs.k8s.io/kueue/cmd/kueue`` from the Go module proxy once per machine and
copies the release's ``config/components/{crd,webhook}`` beside it. :func:`start` installs those CRDs,
starts the controller as a host process with the admin kubeconfig (``batch/job`` is the one integration
on), and registers the release's webhooks for Jobs and Kueue's own kinds. Kueue's own certificate
management rotates a Secret and injects its CA into the webhook configurations of a Service in
``kueue-system``; the API server runs on this host and no kube-proxy routes a Service, so instead the
webhooks (and the CRDs' conversion webhook) point at ``https://127.0.0.1:<port>`` with a certificate made
here for that address, and ``internalCertManagement`` is off. Everything else is Kueue as released.

:func:`stop` deletes the webhook configurations before it stops the controller: a webhook with
``failurePolicy: Fail`` and nobody listening would refuse every Job in the cluster.
"""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import certs, controlplane, processes
from .layout import REPO_ROOT, Layout

NAME = "kueue"
NAMESPACE = "kueue-system"
BUILD_SCRIPT = REPO_ROOT / "hack" / "cluster" / "kueue.sh"
WEBHOOK_PORT = 19443
HEALTH_PORT = 18082
METRICS_PORT = 18444
# Where Kueue reads its metrics server's certificate when its own certificate management is off (a fixed
# path in cmd/kueue/main.go: a mounted Secret in its Deployment); it does not start without one.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
GROUP = "kueue.x-k8s.io"
# Webhooks of the kinds this cluster's Kueue manages; the release registers others (pods, Deployments,
# JobSets, ...) whose integrations are off here: Kueue answers them with no-op webhooks, but the pod
# webhook has no selector and fails closed, so while Kueue restarts it would refuse every pod in the
# cluster. An elastic Job's pods are gated by the Job webhook (its pod template), not the pod webhook.
MANAGED_GROUPS = frozenset({"batch", GROUP})
CONVERTED_CRDS = frozenset({"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"})
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
OURS = {"app.kubernetes.io/managed-by": "ddpjob-test-cluster"}
"""The label of the webhook configurations registered here: ``stop`` deletes them by it."""


def build() -> Path:
    """The directory of the built controller (``bin/kueue``) and the release's manifests (``config/``)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {result.returncode}); its output is above")
    return Path(result.stdout.strip().splitlines()[-1])


def configuration(cert_dir: Path, pods_ready_timeout: float | None = None) -> dict[str, Any]:
    """Kueue's Configuration: the release's defaults, but local ports, no leader election, our certificate,
    ``batch/job`` only; ``waitForPodsReady`` (requeue a gang whose pods are not all ready in time, backoff
    1 s) when ``pods_ready_timeout`` is given."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{HEALTH_PORT}"},
        "metrics": {"bindAddress": f"127.0.0.1:{METRICS_PORT}"},
        "webhook": {"host": "127.0.0.1", "port": WEBHOOK_PORT, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]},
    }
    if pods_ready_timeout is not None:
        config["waitForPodsReady"] = {
            "timeout": f"{pods_ready_timeout:g}s",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1, "backoffMaxSeconds": 5},
        }
    return config


def _client_config(path: str, ca_bundle: str) -> dict[str, str]:
    return {"url": f"https://127.0.0.1:{WEBHOOK_PORT}{path}", "caBundle": ca_bundle}


def crds(config_dir: Path, ca_bundle: str) -> list[dict[str, Any]]:
    """The release's CRDs; those it serves in two versions convert through its webhook, as released."""
    out = []
    for file in sorted((config_dir / "crd" / "bases").glob("*.yaml")):
        crd = yaml.safe_load(file.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": _client_config("/convert", ca_bundle),
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def _managed(webhook: Mapping[str, Any]) -> bool:
    return all(set(rule.get("apiGroups", [])) <= MANAGED_GROUPS for rule in webhook.get("rules", []))


def webhooks(config_dir: Path, ca_bundle: str) -> list[dict[str, Any]]:
    """The release's webhook configurations, renamed ``kueue-*``, kept to Jobs and Kueue's kinds, each
    pointing at the controller on this host."""
    out = []
    for doc in yaml.safe_load_all((config_dir / "webhook" / "manifests.yaml").read_text()):
        if not doc or doc.get("kind") not in WEBHOOK_KINDS:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}", "labels": dict(OURS)}
        kept = [hook for hook in doc.get("webhooks", []) if _managed(hook)]
        for hook in kept:
            hook["clientConfig"] = _client_config(hook["clientConfig"]["service"]["path"], ca_bundle)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def _certificates(directory: Path) -> str:
    """A CA and the webhook server's certificate for 127.0.0.1 (``tls.crt``/``tls.key``, the names
    controller-runtime reads), made once per cluster (the next ``up`` starts afresh); returns the CA as a
    caBundle."""
    if (directory / "ca.crt").exists() and (directory / "tls.crt").exists():
        return base64.b64encode((directory / "ca.crt").read_bytes()).decode()
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.make_ca(directory, "ca", "ddpjob-test-kueue-ca")
    pair = certs.issue(
        ca, directory, "serving", common_name="kueue-webhook", ip_addresses=["127.0.0.1"], server=True
    )
    shutil.copyfile(pair.cert, directory / "tls.crt")
    shutil.copyfile(pair.key, directory / "tls.key")
    return base64.b64encode(ca.cert.read_bytes()).decode()


def _kubectl(
    layout: Layout, *args: str, input: str | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(layout.kubeconfig), *args],
        input=input,
        text=True,
        capture_output=True,
        check=check,
    )


def _apply(layout: Layout, objects: list[dict[str, Any]]) -> None:
    manifest = yaml.safe_dump_all(objects)
    _kubectl(layout, "apply", "--server-side", "--force-conflicts", "-f", "-", input=manifest, check=True)


def _webhook_serves(layout: Layout) -> bool:
    """A server-side dry run of a ResourceFlavor passes through Kueue's webhooks only when they answer."""
    flavor = yaml.safe_dump(
        {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"}}
    )
    return _kubectl(layout, "create", "--dry-run=server", "-f", "-", input=flavor).returncode == 0


def _up(layout: Layout) -> bool:
    if processes.read_pid(layout.pid(NAME)) is None:
        tail = layout.log(NAME).read_text()[-2000:]
        raise RuntimeError(f"Kueue exited; the end of {layout.log(NAME)}:\n{tail}")
    return controlplane.http_ok(f"http://127.0.0.1:{HEALTH_PORT}/readyz")


def install_crds(layout: Layout) -> tuple[Path, str]:
    """Builds Kueue if needed, makes the webhook certificate and installs the release's CRDs (the
    controller not started: enough for an operator to list Workloads); returns Kueue's directory and the
    caBundle of its webhooks."""
    home = build()
    ca_bundle = _certificates(layout.root / NAME / "certs")
    installed = crds(home / "config", ca_bundle)
    _apply(layout, installed)
    names = [f"crd/{crd['metadata']['name']}" for crd in installed]
    _kubectl(layout, "wait", "--for=condition=Established", *names, "--timeout=60s", check=True)
    return home, ca_bundle


def start(layout: Layout, *, pods_ready_timeout: float | None = None) -> None:
    """Installs the CRDs and webhooks and starts the controller (stopping one that runs); returns once
    its webhooks answer."""
    stop(layout)
    home, ca_bundle = install_crds(layout)
    work = layout.root / NAME
    _kubectl(layout, "create", "namespace", NAMESPACE)
    METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copyfile(work / "certs" / name, METRICS_CERT_DIR / name)
    config_file = work / "config.yaml"
    config_file.write_text(yaml.safe_dump(configuration(work / "certs", pods_ready_timeout)))
    processes.spawn(
        NAME,
        [
            str(home / "bin" / "kueue"),
            f"--config={config_file}",
            f"--kubeconfig={layout.kubeconfig}",
            # ElasticJobsViaWorkloadSlices (alpha in v0.17): an elastic DDPJob's scale-up is a new Workload
            # slice, its new pods gated by the Job webhook until the slice is admitted
            "--feature-gates=VisibilityOnDemand=false,ElasticJobsViaWorkloadSlices=true",
            "--zap-log-level=2",
        ],
        pid_file=layout.pid(NAME),
        log_file=layout.log(NAME),
    )
    controlplane.wait_until("Kueue's /readyz", lambda: _up(layout), timeout=120, log=layout.log(NAME))
    _apply(layout, webhooks(home / "config", ca_bundle))
    controlplane.wait_until(
        "Kueue's webhooks", lambda: _webhook_serves(layout), timeout=60, log=layout.log(NAME)
    )


def stop(layout: Layout) -> bool:
    """Deletes Kueue's webhook configurations, then stops the controller; True if one was running."""
    kinds = ",".join(kind.lower() for kind in WEBHOOK_KINDS)
    selector = ",".join(f"{k}={v}" for k, v in OURS.items())
    _kubectl(layout, "delete", kinds, "-l", selector, "--ignore-not-found")
    return processes.stop(layout.pid(NAME), grace=5)
