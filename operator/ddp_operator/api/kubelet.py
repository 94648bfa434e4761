"""A container's environment and command line, computed from its Pod exactly as the kubelet does.

Pure functions, no I/O, shared by every mode: ``ddpjob local`` runs a pod's container as a local process
with them, the operator's ``podcheck`` reads resource quantities with them, and the node agent of the test
cluster starts its pods' containers with them. The rules follow the kubelet's
``makeEnvironmentVariables`` and ``third_party/forked/golang/expansion``:

- ``envFrom`` sources first, then ``env`` in order; a later name replaces an earlier one.
- An ``env`` ``value`` may refer to a variable defined earlier with ``$(NAME)``; ``$$`` is an escaped
  ``$``; a reference to an unknown name stays as written (``$(NAME)``). ``valueFrom`` values are never
  expanded.
- ``command`` and ``args`` are expanded the same way against the final environment.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

__all__ = [
    "ResolveError",
    "expand",
    "field_value",
    "parse_quantity",
    "pod_command",
    "resolve_env",
]

Pod = Mapping[str, Any]
Lookup = Callable[[str, str], "Mapping[str, str] | None"]
"""(namespace, name) -> the ConfigMap's or Secret's data (Secret values already decoded), or None."""


class ResolveError(ValueError):
    """A variable cannot be resolved; the message names the container, the variable and the cause."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion of ``text`` against ``env``.

    ``$(NAME)`` becomes ``env[NAME]`` or stays ``$(NAME)`` when undefined; ``$$`` becomes ``$``; any other
    ``$`` (including an unclosed ``$(``) is kept as written.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 == n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2 : close]
                out.append(env.get(name, f"$({name})"))
                i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")


def field_value(pod: Pod, path: str, *, pod_ip: str = "", host_ip: str = "") -> str:
    """The value of a ``fieldRef.fieldPath`` for ``pod``; ``pod_ip``/``host_ip`` override its status.

    Supported as by the kubelet: metadata.name, metadata.namespace, metadata.uid,
    metadata.labels['k'], metadata.annotations['k'], spec.nodeName, spec.serviceAccountName,
    status.hostIP, status.hostIPs, status.podIP, status.podIPs.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    pod_ip = pod_ip or status.get("podIP") or ""
    host_ip = host_ip or status.get("hostIP") or ""
    simple: dict[str, str] = {
        "metadata.name": meta.get("name") or "",
        "metadata.namespace": meta.get("namespace") or "",
        "metadata.uid": meta.get("uid") or "",
        "spec.nodeName": spec.get("nodeName") or "",
        "spec.serviceAccountName": spec.get("serviceAccountName") or "",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return simple[path]
    match = _SUBSCRIPT.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ResolveError(f"unsupported fieldRef.fieldPath {path!r}")


_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity (``"500m"``, ``"2Gi"``, ``"1e3"``, ``4``) as a Decimal."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ResolveError(f"not a resource quantity: {text!r}")
    number, suffix = match.groups()
    if suffix and "e" in number.lower():
        raise ResolveError(f"not a resource quantity: {text!r}")
    return Decimal(number) * Decimal(_SUFFIXES[suffix])


def _resource_value(
    container: Mapping[str, Any], ref: Mapping[str, Any], node_allocatable: Mapping[str, Any]
) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    if kind not in ("limits", "requests") or not name:
        raise ResolveError(f"unsupported resourceFieldRef.resource {ref.get('resource')!r}")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = node_allocatable.get(name, 0)
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(parse_quantity(raw) / divisor))


def resolve_env(
    pod: Pod,
    container: Mapping[str, Any],
    *,
    pod_ip: str = "",
    host_ip: str = "",
    config_maps: Lookup | None = None,
    secrets: Lookup | None = None,
    node_allocatable: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The environment the kubelet gives ``container`` of ``pod`` (no service links, no image env)."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    cname = container.get("name", "?")
    env: dict[str, str] = {}

    def fetch(lookup: Lookup | None, what: str, name: str, optional: bool) -> Mapping[str, str]:
        data = lookup(namespace, name) if lookup else None
        if data is None and not optional:
            raise ResolveError(f"container {cname!r}: {what} {namespace}/{name} not found")
        return data or {}

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        for key, lookup, what in (
            ("configMapRef", config_maps, "ConfigMap"),
            ("secretRef", secrets, "Secret"),
        ):
            ref = source.get(key)
            if ref:
                data = fetch(lookup, what, ref["name"], bool(ref.get("optional")))
                env.update({prefix + k: str(v) for k, v in data.items()})

    for var in container.get("env") or []:
        name = var["name"]
        source = var.get("valueFrom")
        if not source:
            env[name] = expand(str(var.get("value") or ""), env)
        elif "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip=pod_ip, host_ip=host_ip)
        elif "resourceFieldRef" in source:
            env[name] = _resource_value(container, source["resourceFieldRef"], node_allocatable or {})
        else:
            for key, lookup, what in (
                ("configMapKeyRef", config_maps, "ConfigMap"),
                ("secretKeyRef", secrets, "Secret"),
            ):
                ref = source.get(key)
                if not ref:
                    continue
                optional = bool(ref.get("optional"))
                data = fetch(lookup, what, ref["name"], optional)
                if ref["key"] in data:
                    env[name] = str(data[ref["key"]])
                elif not optional:
                    raise ResolveError(
                        f"container {cname!r}: env {name}: key {ref['key']!r} not in {what} {ref['name']}"
                    )
                break
            else:
                raise ResolveError(f"container {cname!r}: env {name}: unsupported valueFrom {sorted(source)}")
    return env


def pod_command(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command + args`` with ``$(VAR)`` expanded; the image's entrypoint is unknown here, so a container
    without ``command`` runs its ``args`` as the command line."""
    command: Sequence[str] = container.get("command") or []
    args: Sequence[str] = container.get("args") or []
    argv = [expand(str(part), env) for part in [*command, *args]]
    if not argv:
        raise ResolveError(f"container {container.get('name', '?')!r} has neither command nor args")
    return argv
