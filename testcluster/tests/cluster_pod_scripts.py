"""Programs that the test cluster's own tests run in pods: a one-shot TCP server."""

from __future__ import annotations

SERVER = """
import socket
s = socket.create_server(("", 8080))
conn, peer = s.accept()
conn.sendall(f"hello from {socket.gethostname()} to {peer[0]}".encode())
conn.close()
"""
