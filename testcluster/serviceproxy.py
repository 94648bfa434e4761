"""The ``kubernetes`` Service for pods: a userspace proxy from its ClusterIP to the API server.

There is no kube-proxy in the test cluster, so ClusterIPs are not routed. One of them must work for pods
that talk to the API server from inside the cluster (the operator's Deployment, with its in-cluster
config): the ``kubernetes`` Service in ``default``. The kubelet gives every container
``KUBERNETES_SERVICE_HOST``/``PORT`` naming that Service's ClusterIP and port; here the node agent does the
same, and this proxy (what kube-proxy's old ``userspace`` mode did, for this one Service) listens on that
address, which the pod bridge holds (pods route the service network via the bridge), and forwards each
connection to the API server on 127.0.0.1. The TLS session is the client's with the API server: the proxy
only copies bytes, and the serving certificate already names the ClusterIP.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

log = logging.getLogger("nodeagent.proxy")

MASTER_SERVICE_PATH = "/api/v1/namespaces/default/services/kubernetes"


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve_one(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        server = socket.create_connection(upstream, timeout=10)
    except OSError as exc:
        log.warning("proxy: cannot reach %s:%d: %s", *upstream, exc)
        client.close()
        return
    server.settimeout(None)
    back = threading.Thread(target=_pipe, args=(server, client), daemon=True)
    back.start()
    _pipe(client, server)
    back.join()
    client.close()
    server.close()


class ServiceProxy:
    """Listens on ``listen`` and copies every connection to and from ``upstream``, until :meth:`close`."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listen, self.upstream = listen, upstream
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(listen)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._accept, name="service proxy", daemon=True)

    def start(self) -> ServiceProxy:
        self._thread.start()
        log.info("service proxy %s:%d -> %s:%d", *self.listen, *self.upstream)
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=_serve_one, args=(client, self.upstream), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def master_service_env(service: dict[str, Any] | None) -> dict[str, str]:
    """The variables the kubelet gives every container for the ``kubernetes`` Service (even with
    ``enableServiceLinks: false``): ``KUBERNETES_SERVICE_HOST``, ``KUBERNETES_SERVICE_PORT`` and the
    Docker-link style ``KUBERNETES_PORT_*``. Empty while the Service does not exist."""
    if not service:
        return {}
    host = service["spec"]["clusterIP"]
    env = {"KUBERNETES_SERVICE_HOST": host}
    for i, port in enumerate(service["spec"].get("ports") or []):
        number, proto = str(port["port"]), str(port.get("protocol") or "TCP")
        if i == 0:
            env["KUBERNETES_SERVICE_PORT"] = number
            env["KUBERNETES_PORT"] = f"{proto.lower()}://{host}:{number}"
        if port.get("name"):
            env[f"KUBERNETES_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = number
        prefix = f"KUBERNETES_PORT_{number}_{proto}"
        env.update(
            {
                prefix: f"{proto.lower()}://{host}:{number}",
                f"{prefix}_PROTO": proto.lower(),
                f"{prefix}_PORT": number,
                f"{prefix}_ADDR": host,
            }
        )
    return env
