"""The slice of the kubelet's HTTPS API that ``kubectl logs`` needs: ``GET /containerLogs/{ns}/{pod}/{c}``.

The API server calls ``https://<node InternalIP>:<kubeletEndpoint port>`` with its kubelet client
certificate; each Node gets its own port (``KUBELET_PORT + index``), so both Nodes can be 127.0.0.1.
Query parameters honoured: ``follow``, ``tailLines``, ``limitBytes``. Not supported: ``previous``,
``timestamps``, ``sinceSeconds``, exec, attach and port-forward.
"""

from __future__ import annotations

import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, urlsplit

from .layout import Layout

if TYPE_CHECKING:
    from .podrunner import PodRunner


class RunnerFinder(Protocol):
    def find_runner(self, namespace: str, name: str) -> PodRunner | None: ...


def tail_lines(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def _handler(agent: RunnerFinder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: the agent logs what matters
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/{namespace}/{pod}/{container} is served")
                return
            _, namespace, pod, container = parts
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            runner = agent.find_runner(namespace, pod)
            if runner is None or container not in {r.name for r in runner.init_runs + runner.runs}:
                self.send_error(404, f"container {container} of pod {namespace}/{pod} is not on this node")
                return
            self._stream(runner, container, query)

        def _stream(self, runner: PodRunner, container: str, query: dict[str, str]) -> None:
            path: Path = runner.log_path(container)
            data = path.read_bytes() if path.exists() else b""
            if "tailLines" in query:
                data = tail_lines(data, int(query["tailLines"]))
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent = 0

            def send(chunk: bytes) -> bool:
                nonlocal sent
                if limit is not None:
                    chunk = chunk[: max(0, limit - sent)]
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    sent += len(chunk)
                return limit is None or sent < limit

            offset = path.stat().st_size if path.exists() else 0
            more = send(data)
            if query.get("follow") in ("true", "1"):
                while more:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    more = send(chunk)
                    if not chunk:
                        if not runner.container_running(container):
                            break
                        time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def serve(agent: RunnerFinder, layout: Layout, *, port: int, name: str) -> ThreadingHTTPServer:
    """Starts the endpoint on 127.0.0.1:``port`` in a daemon thread; only the API server's client
    certificate (signed by the cluster CA) is accepted."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(agent))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(layout.pki / "kubelet.crt", layout.pki / "kubelet.key")
    context.load_verify_locations(layout.pki / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name=f"kubelet-api {name}", daemon=True).start()
    return server
