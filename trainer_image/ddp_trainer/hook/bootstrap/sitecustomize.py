"""The no-code-change hook's entry: Python imports this file as ``sitecustomize`` at the start of every
process whose ``PYTHONPATH`` names the folder it was copied to (``python -m ddp_trainer.inject DEST``).

It must cost next to nothing where there is nothing to do (a shell's ``python``, pip, the torchrun agent):
standard library only, no torch import of its own, and it never raises. In a training process (``RANK`` or
``LOCAL_RANK`` set: a torchrun worker, or a one-process pod) it waits, with a finder on ``sys.meta_path``,
for the script to import torch, and once torch has loaded hands over to
:func:`ddp_trainer.hook.autoinstrument.install` (which finds the DDP model when it is built and counts
optimizer steps). Then it runs the ``sitecustomize`` the image had, if any, as Python would have.

Written for any Python 3.6+ (no ``from __future__``, no newer syntax), so that an old interpreter reads
it and says why it stays off.
"""

import importlib.machinery
import os
import sys
import types

MYPY = False
if MYPY:  # for the type checker only: importing typing at every start would cost time
    from importlib.abc import Loader

_HERE = os.path.dirname(os.path.abspath(__file__))
_VENDOR = os.path.join(_HERE, "vendor")  # pure-Python dependencies the image may lack (prometheus_client)
_MIN_PYTHON = (3, 11)
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
"""What cuBLAS needs before it starts to run deterministically, for the compute probe
(:data:`ddp_trainer.contract.CUBLAS_WORKSPACE`; standard library only here, a test keeps the two equal)."""
_PREFIX = "ddpjob sync health"


def _say(text: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(_PREFIX + ": " + text + "\n")
        sys.stderr.flush()


_state = {"activated": False, "why": ""}  # whether install() ran; why it did not, when it could not


def _activate() -> None:
    """Called once torch has loaded: the check's own code, from this folder (never fatal, never twice)."""
    if _state["activated"]:
        return
    _state["activated"] = True
    if _VENDOR not in sys.path:
        sys.path.append(_VENDOR)  # last: the image's own copies win
    try:
        from ddp_trainer.hook import autoinstrument

        autoinstrument.install()
    except Exception as error:  # the hook must never stop a script that would have run without it
        why = f"{type(error).__name__}: {error}"
        _state["why"] = why
        _say(f"off: {why}")
        import atexit

        atexit.register(_report_off, why)


def _torch_loaded() -> bool:
    """torch is in ``sys.modules`` and has finished loading (not half-way through its own ``__init__``)."""
    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    return torch is not None and not getattr(spec, "_initializing", False)


class _Chained:
    """torch's loader, followed by :func:`_activate` (the module keeps its own loader); anything else
    asked of it (``is_package``, ``get_resource_reader``, ...) is torch's loader's."""

    def __init__(self, loader: "Loader") -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> "types.ModuleType | None":
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _TorchWatcher)]
        _activate()


class _TorchWatcher:
    """Waits for torch to load, however it is imported: ``import torch``, ``importlib.import_module``, a
    library that imports it for the script. It stays on ``sys.meta_path`` until torch has run, so a probe
    (``importlib.util.find_spec("torch")``, which transformers, datasets and accelerate do before they
    import it) gets torch's spec with the chained loader and consumes nothing; the real import then runs
    that loader. Every other name costs one comparison, and a look at whether torch arrived by a way this
    finder did not see (another finder in front of it), which installs the hook late rather than never."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> "importlib.machinery.ModuleSpec | None":
        if name != "torch":
            if not _state["activated"] and "torch" in sys.modules and _torch_loaded():
                _say("torch was loaded by a way the hook did not see: the check starts late")
                sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
                _activate()
            return None
        if self.busy:  # a finder below asked the import system again
            return None
        self.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):  # as the import system does, without this one
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if spec is not None and hasattr(loader, "exec_module") and not isinstance(loader, _Chained):
            spec.loader = _Chained(loader)  # type: ignore[arg-type]
        return spec


def _at_exit() -> None:
    """Say why nothing was checked when torch loaded but the hook never installed."""
    if not _state["activated"] and "torch" in sys.modules:
        why = "torch was loaded without the hook seeing it (an import finder in front of the hook's?)"
        _say("off: " + why)
        _report_off(why)


def _report_off(why: str) -> None:
    """The pod's report (local rank 0) when the hook could not switch on: the job's status then says why
    nothing was verified. A report already there (a rank's failure) stays; any error here is swallowed."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    try:
        from ddp_trainer import contract
        from ddp_trainer.core import config
        from ddp_trainer.reporting import report

        report.write_unless_reported(
            config.read_pod_env(os.environ).termination_log,
            {
                "result": contract.SUCCEEDED,
                "reason": contract.SYNC_HOOK_OFF,
                "message": "the sync hook could not switch on: " + why + "; nothing was verified",
                "worldSize": int(os.environ.get("WORLD_SIZE", "1") or 1),
            },
        )
    except Exception as error:
        _say("could not write the report: " + type(error).__name__ + ": " + str(error))


def _start() -> None:
    env = os.environ
    if env.get("DDPJOB_SYNC_HOOK", "") == "0" or ("RANK" not in env and "LOCAL_RANK" not in env):
        return
    if sys.version_info < _MIN_PYTHON:
        found, needed = sys.version_info[:2], _MIN_PYTHON
        _say(
            f"off: Python {found[0]}.{found[1]} is older than {needed[0]}.{needed[1]}, which the check needs"
        )
        return
    env.setdefault(*CUBLAS_WORKSPACE)  # before torch (and cuBLAS) starts; a value of the user's stays
    if "torch" in sys.modules:  # imported by an earlier sitecustomize or .pth file
        _activate()
    else:
        sys.meta_path.insert(0, _TorchWatcher())
        import atexit

        atexit.register(_at_exit)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path (the image's own), which this file hides."""
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    try:
        _start()
    except Exception as error:
        _say(f"off: {type(error).__name__}: {error}")
    _chain()  # its errors are the image's own, reported as Python reports them
