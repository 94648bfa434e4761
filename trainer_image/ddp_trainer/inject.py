"""``python -m ddp_trainer.inject DEST``: put the no-code-change hook where a pod's other containers find
it, as the OpenTelemetry Operator's init container copies its Python auto-instrumentation.

The operator renders this as an init container of the trainer image when ``spec.syncCheck.autoInstrument``
is on and the DDPJob runs its own command; ``DEST`` is an emptyDir the trainer container mounts at
:data:`ddp_trainer.contract.SYNC_HOOK_DIR`, first on its ``PYTHONPATH``. It copies

* ``ddp_trainer`` itself (this package, the check's code) to ``DEST/ddp_trainer``;
* the hook's entry, ``ddp_trainer/hook/bootstrap/sitecustomize.py``, to ``DEST/sitecustomize.py``;
* the pure-Python dependencies the user's image may lack (``prometheus_client``) to ``DEST/vendor``, which
  the hook puts *last* on ``sys.path``, so the image's own copies win.

Only torch must be in the user's image (and Python 3.11 or newer). Standard library only: the init
container starts in well under a second.
"""

from __future__ import annotations

import compileall
import importlib.util
import shutil
import sys
from pathlib import Path

VENDORED = ("prometheus_client",)
"""Pure-Python packages the check imports that the user's image may not have."""
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def package_dir(name: str) -> Path:
    """The folder of the installed package ``name``, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"ddp_trainer.inject: the package {name!r} is not installed in this image")
    return Path(next(iter(spec.submodule_search_locations)))


def install(dest: Path) -> int:
    """Copy the hook, ``ddp_trainer`` and the vendored packages into ``dest``; the number of files."""
    dest.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    if here == (dest / "ddp_trainer").resolve():
        raise SystemExit(f"ddp_trainer.inject: {dest} is where this ddp_trainer runs from: nothing to copy")
    shutil.copytree(here, dest / "ddp_trainer", ignore=_IGNORE, dirs_exist_ok=True)
    shutil.copyfile(here / "hook" / "bootstrap" / "sitecustomize.py", dest / "sitecustomize.py")
    for name in VENDORED:
        shutil.copytree(package_dir(name), dest / "vendor" / name, ignore=_IGNORE, dirs_exist_ok=True)
    # the trainer container mounts it read-only: compiled here, its modules need no compiling per process
    # (where its Python is this one's; another version compiles them in memory, as Python does)
    compileall.compile_dir(dest, quiet=2)
    return sum(1 for path in dest.rglob("*") if path.is_file())


USAGE = """usage: python -m ddp_trainer.inject DEST

Copy the no-code sync hook (sitecustomize.py), ddp_trainer and the vendored pure-Python packages into the
folder DEST (created if missing), which a training container then puts first on its PYTHONPATH."""


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    count = install(dest)
    print(f"ddpjob sync health: the hook and ddp_trainer are in {dest} ({count} files)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
