"""The API server's audit log: what ServiceAccounts outside ``kube-system`` asked of the API server.

The test kube-apiserver logs every request of a ServiceAccount outside ``kube-system`` at ``Metadata``
level (who, verb, resource, name, response code; no bodies) to :attr:`Layout.audit_log`, as JSON lines in
the default blocking mode (the policy: :data:`controlplane.AUDIT_POLICY`). So the operator, which
authenticates as the chart's ServiceAccount in every cluster test, is audited; the tests' admin user,
the node agent and the controller-manager's own controllers (kube-system accounts) are not.

:class:`AuditLog` reads it: ``mark()`` then ``requests(since=mark, user=...)`` gives what one account did
in between, one :class:`Request` per completed request (watches: when they end). It reads the current
file only: the API server rotates it at 200 MB, far beyond what one test run writes.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

MUTATING = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Request:
    """One completed API request."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    dry_run: bool = False
    """``?dryRun=All``: checked and admitted like the real request, and nothing stored."""
    at: float = 0.0
    """When the API server completed it (``stageTimestamp``, seconds since the epoch, microseconds)."""

    @property
    def mutating(self) -> bool:
        """A request that changed something (a dry run changes nothing)."""
        return self.verb in MUTATING and not self.dry_run

    @property
    def kind(self) -> str:
        """``resource`` or ``resource/subresource`` (``ddpjobs/status``)."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def service_account(namespace: str, name: str) -> str:
    """The user name a ServiceAccount's token authenticates as."""
    return f"system:serviceaccount:{namespace}:{name}"


class AuditLog:
    """Reads the audit log at ``path`` (the API server appends to it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """The log's end now: pass it to :meth:`requests` to see only what comes after."""
        self._check()
        return self.path.stat().st_size

    def requests(self, *, since: int = 0, user: str | None = None) -> list[Request]:
        """Completed requests logged after ``since`` (a :meth:`mark`), of ``user`` if given."""
        self._check()
        with self.path.open("rb") as log:
            log.seek(since)
            text = log.read()
        out = []
        for line in text.splitlines():
            if not line.endswith(b"}"):
                continue  # the API server is still writing this line
            entry = json.loads(line)
            if entry.get("stage") != "ResponseComplete":
                continue
            who = entry.get("user", {}).get("username", "")
            if user is not None and who != user:
                continue
            ref = entry.get("objectRef") or {}
            out.append(
                Request(
                    user=who,
                    verb=entry.get("verb", ""),
                    group=ref.get("apiGroup", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    code=int((entry.get("responseStatus") or {}).get("code") or 0),
                    dry_run="dryRun=" in entry.get("requestURI", ""),
                    at=_seconds(entry.get("stageTimestamp")),
                )
            )
        return out

    def _check(self) -> None:
        if not self.path.exists():
            raise FileNotFoundError(
                f"no audit log at {self.path}: this cluster was started without auditing "
                "(by an older checkout?); restart it with `make cluster-down cluster-up`"
            )


def _seconds(stamp: str | None) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp() if stamp else 0.0


def writes_by_kind(requests: list[Request]) -> collections.Counter[str]:
    """Mutating requests counted by ``verb kind`` (``create jobs``, ``patch ddpjobs/status``)."""
    return collections.Counter(f"{r.verb} {r.kind}" for r in requests if r.mutating)
