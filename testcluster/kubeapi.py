"""A small JSON client for the Kubernetes API: plain dicts in and out.

Only the kubeconfig loading comes from the ``kubernetes`` package (stable across its releases, unlike
its generated API classes); requests go through urllib3, which that package depends on.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def final_delete_options(uid: str) -> dict[str, Any]:
    """The kubelet's last word on a pod it stopped: delete now, but only this incarnation of the name."""
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": uid},
    }


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class Kube:
    """Talks to the API server named by ``kubeconfig``."""

    def __init__(self, kubeconfig: str, *, timeout: float = 30.0) -> None:
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self._headers = {"Accept": "application/json"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            self._headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        ctx = (
            ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.ssl_ca_cert
            else ssl.create_default_context()
        )
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._timeout = timeout
        self._http = urllib3.PoolManager(ssl_context=ctx, maxsize=8)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        ok_missing: bool = False,
    ) -> dict[str, Any] | None:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        resp = self._http.urlopen(
            method,
            self.host + path + _query_string(params),
            body=data,
            headers=headers,
            timeout=self._timeout,
        )
        if resp.status == 404 and ok_missing:
            return None
        if resp.status >= 300:
            raise ApiError(method, path, resp.status, resp.data.decode(errors="replace"))
        return json.loads(resp.data) if resp.data else {}

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        result = self.request("GET", path, params=params)
        assert result is not None
        return result

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        return self.request("GET", path, ok_missing=True)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result = self.request("POST", path, body)
        assert result is not None
        return result

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> dict[str, Any] | None:
        return self.request("PATCH", path, body, content_type=content_type, ok_missing=True)

    def put(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result = self.request("PUT", path, body)
        assert result is not None
        return result

    def delete(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return self.request("DELETE", path, body, ok_missing=True)

    def watch(self, path: str, *, timeout_seconds: int = 60, **params: Any) -> Iterator[dict[str, Any]]:
        """Yields watch events (``{"type": ..., "object": ...}``) until the server ends the watch."""
        query = {**params, "watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "true"}
        resp = self._http.urlopen(
            "GET",
            self.host + path + _query_string(query),
            headers=self._headers,
            timeout=urllib3.Timeout(connect=self._timeout, read=timeout_seconds + 15),
            preload_content=False,
        )
        try:
            if resp.status >= 300:
                raise ApiError("WATCH", path, resp.status, resp.read().decode(errors="replace"))
            buffer = b""
            for chunk in resp.stream(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()


def _query_string(params: Mapping[str, Any] | None) -> str:
    if not params:
        return ""
    return "?" + urlencode({k: v for k, v in params.items() if v is not None})
