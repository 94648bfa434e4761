"""Files of ``projected``, ``configMap``, ``secret`` and ``downwardAPI`` volumes, as the kubelet writes them.

The API server's ServiceAccount admission gives every pod that does not opt out
(``automountServiceAccountToken: false``) a projected volume ``kube-api-access-*``: a token for the pod's
ServiceAccount (``serviceAccountToken``, from the TokenRequest API, bound to the pod), the cluster CA
(ConfigMap ``kube-root-ca.crt``, key ``ca.crt``) and the namespace (downward API), mounted read-only at
``/var/run/secrets/kubernetes.io/serviceaccount`` in each container. The node agent writes those files
into the volume's folder before the container starts; :mod:`volumes` then bind-mounts the folder.

Tokens: asked for with the projection's ``expirationSeconds`` (the admission default 3607 s); the API
server's ``--service-account-extend-token-expiration`` (on by default) turns a 3607 s pod-bound token into
a year's, as for a real kubelet, so the agent does not rotate them (a real kubelet would, at 80 % of the
token's life).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_operator.api import kubelet

from .volumes import FILE_VOLUMES, VolumeError

Content = str | bytes  # a Secret's values are bytes (a gzipped config, say), a ConfigMap's text
DataLookup = Callable[[str, str], Mapping[str, Content] | None]  # (namespace, name) → data, None if absent
TokenLookup = Callable[[str, int, str | None], str]  # (service account, seconds, audience) → token


@dataclass(frozen=True)
class Sources:
    """Where the agent reads what a volume projects."""

    config_map: DataLookup
    secret: DataLookup
    token: TokenLookup


def is_file_volume(volume: Mapping[str, Any]) -> bool:
    return any(kind in volume for kind in FILE_VOLUMES)


def _keyed(
    what: str, data: Mapping[str, Content] | None, ref: Mapping[str, Any], name: str
) -> dict[str, Content]:
    """The files of a ConfigMap or Secret source: every key, or the ``items`` it names."""
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return {}
        raise VolumeError(f"{what} {name!r} not found")
    items = ref.get("items")
    if not items:
        return dict(data)
    out: dict[str, Content] = {}
    for item in items:
        if item["key"] in data:
            out[item["path"]] = data[item["key"]]
        elif not optional:
            raise VolumeError(f"{what} {name!r} has no key {item['key']!r}")
    return out


def _downward(pod: Mapping[str, Any], items: list[Mapping[str, Any]]) -> dict[str, str]:
    out = {}
    for item in items:
        if "fieldRef" not in item:
            raise VolumeError(f"downwardAPI item {item.get('path')!r}: only fieldRef is supported")
        out[item["path"]] = kubelet.field_value(pod, item["fieldRef"]["fieldPath"])
    return out


def volume_files(pod: Mapping[str, Any], volume: Mapping[str, Any], sources: Sources) -> dict[str, Content]:
    """Relative path → content of every file ``volume`` holds for ``pod``."""
    namespace = pod["metadata"]["namespace"]
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    files: dict[str, Content] = {}
    if "configMap" in volume:
        ref = volume["configMap"]
        files.update(_keyed("configmap", sources.config_map(namespace, ref["name"]), ref, ref["name"]))
    if "secret" in volume:
        ref = volume["secret"]
        name = ref["secretName"]
        files.update(_keyed("secret", sources.secret(namespace, name), ref, name))
    if "downwardAPI" in volume:
        files.update(_downward(pod, volume["downwardAPI"].get("items") or []))
    for source in (volume.get("projected") or {}).get("sources") or []:
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            seconds = int(token.get("expirationSeconds") or 3600)
            files[token["path"]] = sources.token(account, seconds, token.get("audience"))
        elif "configMap" in source:
            ref = source["configMap"]
            files.update(_keyed("configmap", sources.config_map(namespace, ref["name"]), ref, ref["name"]))
        elif "secret" in source:
            ref = source["secret"]
            files.update(_keyed("secret", sources.secret(namespace, ref["name"]), ref, ref["name"]))
        elif "downwardAPI" in source:
            files.update(_downward(pod, source["downwardAPI"].get("items") or []))
        else:
            raise VolumeError(f"projected volume {volume['name']!r}: unsupported source {sorted(source)}")
    return files


def write(folder: Path, files: Mapping[str, Content]) -> None:
    """Writes ``files`` under ``folder`` (0644 files; the folder is mounted read-only where asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    for relative, content in files.items():
        target = folder / relative
        if ".." in Path(relative).parts or Path(relative).is_absolute():
            raise VolumeError(f"volume file path {relative!r} must be relative, without '..'")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        target.chmod(0o644)
