"""A real node's kubelet counts as started once it bound the device-plugin registry socket that every kubelet
on the host shares (:mod:`testcluster.realnode`): the bind is told by the socket's identity, not a clock."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from testcluster import realnode


def _bind(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)  # as a kubelet does: it removes what it finds, then binds
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return server


def test_the_previous_nodes_bind_is_not_this_kubelets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubelet.sock"
    monkeypatch.setattr(realnode, "DEVICE_PLUGINS_SOCKET", path)
    assert not realnode._rebound(realnode._socket_identity())  # none yet
    with _bind(path):  # the node before binds, a moment before this kubelet starts
        before = realnode._socket_identity()
        assert before is not None and not realnode._rebound(before)  # it exits at once: not taken for a bind
        path.unlink()
        assert not realnode._rebound(before)  # removed, not bound yet
        with _bind(path):
            assert realnode._rebound(before)  # this kubelet's own
