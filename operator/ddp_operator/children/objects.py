"""Everything the operator creates for one attempt, assembled from the modules that render each part:
the checkpoint claim, the Service and the Indexed Job (:mod:`ddp_operator.children.render`) and an elastic
job's rendezvous store Job (:mod:`ddp_operator.children.store_job`, which renders with ``render``'s parts, so
the assembly sits above both). Pure: no I/O."""

from __future__ import annotations

from typing import Any

from ddp_operator.api.spec import Spec
from ddp_operator.children.render import external_store, render_checkpoint_claim, render_job, render_service
from ddp_operator.children.store_job import render_store
from ddp_trainer import contract

Obj = dict[str, Any]


def render(spec: Spec, attempt: int = contract.FIRST_ATTEMPT) -> list[Obj]:
    """Everything the operator creates for one attempt, in creation order (an elastic job's rendezvous
    store Job just before the attempt's)."""
    contract.restarts_before(attempt)  # attempts are numbered from contract.FIRST_ATTEMPT
    claim = render_checkpoint_claim(spec)
    store = [render_store(spec, attempt)] if external_store(spec) else []
    return [*([claim] if claim else []), render_service(spec), *store, render_job(spec, attempt)]
