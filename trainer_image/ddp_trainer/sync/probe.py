"""The compute probe: find the rank whose arithmetic differs from its peers'.

The replica check cannot see a rank that computes a wrong gradient: DDP averages it into every replica,
so every rank holds the same (corrupted) model. The probe looks at the arithmetic itself. Every rank runs
one forward and backward pass on the *same* fixed batch with the *same* just-verified parameters, without
DDP's all-reduce (``torch.autograd.grad`` on the unwrapped module: no ``.grad`` is written, no reducer
hook fires, the optimizer is not touched), in eval mode (no dropout, no running-statistics update), under
deterministic algorithms. It fingerprints its local gradients and loss (:mod:`ddp_trainer.sync.fingerprints`)
into one int64; an ``all_gather`` of that int64 and a code of the rank's hardware (a few bytes per rank)
gives every rank the same table, and :func:`verdict` (pure) reads it:

* every digest equal: ``agree``;
* the ranks run different hardware (device type and name, CPU instruction set): ``undecidable`` — their
  bits may differ legitimately, and nobody is accused;
* a rank whose pass could not run deterministically (an op with no deterministic implementation, cuBLAS
  without ``CUBLAS_WORKSPACE_CONFIG``): ``undecidable``, naming the op — training goes on;
* otherwise every rank repeats the probe once. When half of the ranks or more do not reproduce their own
  first result, the model's computation does not reproduce itself on this hardware: ``undecidable``,
  nobody named. A minority of ranks that do not reproduce themselves while the rest do are ``flaky``
  (named as such, not as faulty); when every rank reproduces itself and a strict majority share one
  digest, the others are ``faulty``; with no strict majority (two ranks that differ, a 2-2 split):
  ``undecidable``.

Deterministic for real: the pass runs under ``torch.use_deterministic_algorithms(True)`` with
``warn_only=False`` (with ``warn_only=True`` torch only warns and runs the non-deterministic kernels
anyway: SDPA's memory-efficient and cuDNN attention backward on GPUs gave five different digests in five
passes). cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` (:data:`ddp_trainer.contract.CUBLAS_WORKSPACE`) in the
environment before it starts: the operator's pods, ``ddpjob local`` and the no-code hook set it.

The batch: the one given to :class:`Probe` (a tensor or a tuple of a model's positional arguments), or
a callable ``loss(model) -> scalar`` for a model whose forward needs more; else the first input the
model's ``forward`` sees on rank 0 (a one-shot forward pre-hook: works for the reference trainer, the
Hugging Face callback and hand-written loops alike), or the first batch a framework offers
(:meth:`Probe.offer`, run by its ``step(model, batch)``: the Lightning callback's ``training_step``), sent
to every rank once. The scalar is the output's
``loss`` where the model computes one (Hugging Face models given labels), else the mean square of the
first output tensor: any fixed function of the output serves, it only has to be the same everywhere.

The fire drill that proves it works is :mod:`ddp_trainer.sync.corruption_drill`.

Long because the decision and the collective that feeds it read best side by side.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.sync.fingerprints import fingerprint_tensor, fingerprint_tensors

log = logging.getLogger("ddp_trainer")

Kind = Literal["agree", "faulty", "flaky", "undecidable"]
LossFn = Callable[[nn.Module], torch.Tensor]
StepFn = Callable[[nn.Module, Any], Any]
"""``step(model, batch) -> output``: how a framework runs one batch it offered (:meth:`Probe.offer`)."""


class FaultyRankError(Exception):
    """The probe named a faulty rank and the policy says stop."""

    def __init__(self, result: ProbeResult) -> None:
        super().__init__(result.message)
        self.result = result


@dataclass(frozen=True)
class Verdict:
    """What one probe found: identical on every rank."""

    kind: Kind
    ranks: tuple[int, ...] = ()
    """The faulty or flaky ranks (empty for ``agree`` and ``undecidable``)."""
    why: str = ""
    """For a person: what was seen."""


@dataclass(frozen=True)
class ProbeResult:
    """A verdict with the pods and nodes of the ranks it names."""

    step: int
    verdict: Verdict
    pods: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    seconds: float = 0.0
    devices: tuple[str, ...] = ()
    """The named ranks' devices (:func:`device_id`): a GPU's UUID, what a node's taint names."""

    @property
    def message(self) -> str:
        v = self.verdict
        if v.kind in ("faulty", "flaky"):
            where = ", ".join(
                f"rank {r} (pod {p or '?'}, node {n or '?'})"
                for r, p, n in zip(v.ranks, self.pods, self.nodes, strict=True)
            )
            return f"compute probe at step {self.step}: {v.kind} {where}: {v.why}"
        return f"compute probe at step {self.step}: {v.kind}: {v.why}"


# -- the decision (pure) --------------------------------------------------------------------------------


def strict_majority(values: Sequence[int]) -> int | None:
    """The value more than half of ``values`` share, or None."""
    if not values:
        return None
    value, n = collections.Counter(values).most_common(1)[0]
    return value if 2 * n > len(values) else None


def flaky_ranks(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """Ranks whose repeat of the probe gave another result than their first run."""
    return tuple(r for r, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)


NOT_REPRODUCIBLE = "the model's computation does not reproduce itself on this hardware"


def verdict(
    first: Sequence[int],
    hardware: Sequence[int],
    second: Sequence[int] | None = None,
    errors: Sequence[str] = (),
) -> Verdict:
    """Read the gathered table: ``first[r]`` rank r's digest, ``hardware[r]`` its hardware code,
    ``second[r]`` its repeat's digest (None: not repeated yet), ``errors[r]`` why rank r's pass could not
    run deterministically ("" where it ran). Never accuses where it cannot be sure."""
    failed = [r for r, e in enumerate(errors) if e]
    if failed:
        ranks = ", ".join(map(str, failed))
        return Verdict(
            "undecidable",
            why=f"the probe could not run deterministically on rank {ranks}: {errors[failed[0]]}",
        )
    if len(set(first)) == 1:
        return Verdict("agree", why=f"all {len(first)} ranks computed bit-identical gradients")
    if len(set(hardware)) > 1:
        return Verdict(
            "undecidable",
            why=f"the ranks run {len(set(hardware))} kinds of hardware (device or CPU instruction set), "
            "whose results may differ legitimately",
        )
    if second is None:
        raise ValueError("the ranks disagree: repeat the probe and pass `second`")
    flaky = flaky_ranks(first, second)
    if 2 * len(flaky) >= len(first):  # half or more: the computation, not a rank
        return Verdict(
            "undecidable",
            why=f"{NOT_REPRODUCIBLE}: {len(flaky)} of {len(first)} ranks gave another result when the probe "
            "was repeated (a non-deterministic operation in the forward or backward pass)",
        )
    if flaky:
        return Verdict("flaky", flaky, "did not reproduce its own result when the probe was repeated")
    reference = strict_majority(first)
    if reference is None:
        counts = sorted(collections.Counter(first).values(), reverse=True)
        return Verdict(
            "undecidable", why=f"no majority: the ranks split {'-'.join(map(str, counts))} over the result"
        )
    odd = tuple(r for r, d in enumerate(first) if d != reference)
    return Verdict(
        "faulty",
        odd,
        f"computed gradients that differ from the other {len(first) - len(odd)} ranks' (same batch, same "
        "parameters, same hardware, reproducibly)",
    )


def due(step: int, every: int) -> bool:
    """Whether the probe runs after ``step`` (0: never)."""
    return every > 0 and step > 0 and step % every == 0


# -- running it ---------------------------------------------------------------------------------------


def scalar(output: Any) -> torch.Tensor:
    """The probe's scalar from a model's output: its ``loss`` if it has one, else the mean square of the
    first floating-point tensor in it."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss.float().sum()
    for value in _tensors(output):
        if value.is_floating_point():
            return value.float().square().mean()
    raise TypeError(f"the model's output ({type(output).__name__}) holds no floating-point tensor")


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def _map(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_map(v, fn) for v in value)
    return value


def hardware_code(device: torch.device) -> int:
    """One int64 per kind of hardware: the device type and name, and the CPU's instruction set."""
    name = device.type
    if device.type == "cuda":
        name += ":" + torch.cuda.get_device_name(device)
    name += ":" + str(torch.backends.cpu.get_cpu_capability())
    data = torch.tensor(list(name.encode()), dtype=torch.uint8)
    return int(fingerprint_tensor(data).item())


def device_id(device: torch.device) -> str:
    """The device a rank computes on, as a node's taint may name it (a label value): a GPU's UUID
    (``GPU-…``, as ``nvidia-smi -L`` prints it), ``cuda-<index>`` where torch gives none, or ``cpu``."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"GPU-{uuid}" if uuid else f"cuda-{index}"


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """Deterministic algorithms for real (an op without one raises), no cuDNN autotuning, the RNG state
    kept, for the block's duration."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
            torch.backends.cudnn.benchmark = benchmark


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class Probe:
    """The probe of one model, for one group (collective: every rank builds it and calls :meth:`run` at
    the same steps). ``batch``: a tensor or a tuple of positional arguments for the forward; ``loss``: a
    callable ``loss(model) -> scalar`` (wins over ``batch``); neither: the first input rank 0's model sees.
    ``group``: a CPU (gloo) group for the gather. ``pod``/``node``: where this rank runs."""

    def __init__(
        self,
        model: nn.Module,
        *,
        group: dist.ProcessGroup | None,
        batch: Any = None,
        loss: LossFn | None = None,
        step: StepFn | None = None,
        pod: str = "",
        node: str = "",
    ) -> None:
        self.model = unwrap(model)
        self.group = group
        self.loss = loss
        self.step = step
        self.batch: Any = None if batch is None else (batch if isinstance(batch, tuple) else (batch,), {})
        self.shared = batch is not None or loss is not None  # the same on every rank by the caller's word
        self.pod = pod or os.environ.get("HOSTNAME", "") or socket.gethostname()
        self.node = node
        self._hook: Any = None
        if not self.shared:
            self._hook = self.model.register_forward_pre_hook(self._capture, with_kwargs=True)

    def _capture(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.offer((args, kwargs) if self.step is None else args[0] if len(args) == 1 else args)

    def offer(self, batch: Any) -> None:
        """The probe batch, if none was taken yet (a framework's callback offers the batch it sees before
        the forward; with a ``step`` function it is what ``step`` receives)."""
        if self.batch is None and not self.shared:
            self.batch = _map(batch, lambda t: t.detach().to("cpu", copy=True))
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _share(self) -> None:
        """Rank 0's first batch to every rank, once (a collective on the probe's group)."""
        if self.shared:
            return
        box = [self.batch]
        dist.broadcast_object_list(
            box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group
        )
        self.batch, self.shared = box[0], True

    def _loss(self, device: torch.device) -> torch.Tensor:
        if self.loss is not None:
            return self.loss(self.model)
        batch = _map(self.batch, lambda t: t.to(device))
        if self.step is not None:
            return scalar(self.step(self.model, batch))
        args, kwargs = batch
        return scalar(self.model(*args, **kwargs))

    def attempt(self) -> tuple[int, str]:
        """:meth:`digest`, or (0, why) where the pass cannot run deterministically here (it raised under
        deterministic algorithms): the verdict is then ``undecidable``, and training goes on."""
        try:
            return self.digest(), ""
        except RuntimeError as error:
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            if "determinis" not in text and "CUBLAS_WORKSPACE_CONFIG" not in str(error):
                raise
            log.warning("compute probe: the pass cannot run deterministically here: %s", text)
            return 0, text

    def digest(self) -> int:
        """This rank's result: one forward and backward pass, fingerprinted (gradients, then the loss)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        device = params[0].device if params else torch.device("cpu")
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        try:
            with deterministic(device):
                loss = self._loss(device)
                grads = torch.autograd.grad(loss, params, allow_unused=True) if params else ()
        finally:
            for module, training in modes:
                module.training = training
        tensors = [g if g is not None else torch.zeros(0, device=device) for g in grads]
        vector = fingerprint_tensors([*tensors, loss.detach().reshape(1)], device)
        return int(fingerprint_tensor(vector).item())

    def _gather(self, values: tuple[Any, ...]) -> list[Any]:
        table: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(table, values, group=self.group)
        return table

    def run(self, step: int) -> ProbeResult:
        """One probe (collective): digest, gather, repeat if the ranks disagree, verdict, names."""
        started = time.perf_counter()
        self._share()
        if self.batch is None and self.loss is None:
            why = "no probe batch: the model's forward had not run on rank 0 before the first probe"
            return ProbeResult(step, Verdict("undecidable", why=why))
        params = [p for p in self.model.parameters()]
        device = params[0].device if params else torch.device("cpu")
        table = self._gather((*self.attempt(), hardware_code(device)))
        first, errors, hardware = ([row[i] for row in table] for i in range(3))
        if len(set(first)) == 1 or len(set(hardware)) > 1 or any(errors):  # decided without a repeat
            found = verdict(first, hardware, errors=errors)
            return ProbeResult(step, found, seconds=time.perf_counter() - started)
        second = [row[0] for row in self._gather(self.attempt())]
        found = verdict(first, hardware, second)
        pods, nodes, devices = self.where(found.ranks, device) if found.ranks else ((), (), ())
        return ProbeResult(step, found, pods, nodes, time.perf_counter() - started, devices)

    def where(
        self, ranks: tuple[int, ...], device: torch.device
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The pods, nodes and devices of ``ranks`` (a collective: only after a verdict that names
        someone; the same verdict everywhere)."""
        places: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(places, (self.pod, self.node, device_id(device)), group=self.group)
        return tuple(tuple(places[r][i] for r in ranks) for i in range(3))  # type: ignore[return-value]
