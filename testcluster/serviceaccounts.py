"""Act as a ServiceAccount: a kubeconfig holding a token the TokenRequest API issued for it.

``kubectl --kubeconfig $(hack/cluster/cluster sa-kubeconfig NS NAME) auth can-i --list`` then shows what
``system:serviceaccount:NS:NAME`` may do (the admin kubeconfig could also use ``--as``, but a real token
goes through the same authentication path as the operator's pod would).
"""

from __future__ import annotations

from pathlib import Path

from .controlplane import SERVER, kubeconfig_text
from .kubeapi import Kube
from .layout import Layout


def token_for(kube: Kube, namespace: str, name: str, *, seconds: int = 3600) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    result = kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
    return str(result["status"]["token"])


def write_kubeconfig(kube: Kube, layout: Layout, namespace: str, name: str, path: Path | None = None) -> Path:
    """Writes (default ``.cluster/sa-<ns>-<name>.kubeconfig``) and returns a kubeconfig for the account."""
    path = path or layout.root / f"sa-{namespace}-{name}.kubeconfig"
    user = f"system:serviceaccount:{namespace}:{name}"
    path.write_text(
        kubeconfig_text(SERVER, layout.pki / "ca.crt", user, token_for(kube, namespace, name), namespace)
    )
    path.chmod(0o600)
    return path
