"""Where ``ddpjob local`` finds a script that ``spec.command`` or ``spec.args`` name by a relative path, and
which ones it cannot find, said before any pod starts.

In a cluster the script is in the image and the kubelet runs it from the image's working directory. Here the
pods run in folders of their own, so a relative path is looked up, in order, in the directory ``ddpjob
local`` was started from and in the DDPJob file's directory, and handed to the pod as an absolute path.
Only a relative path that ends in ``.py`` or ``.sh`` and is not a flag counts as a script: a module name
(``-m pkg.train``), a flag value or a word is not a file, and guessing would refuse good jobs. Nor is a
shell's or Python's command string: the argument of ``-c`` (``bash -c "cd src && exec torchrun
train.py"``), or any argument with whitespace in it, is run as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ddp_operator.api.spec import Spec

SCRIPT_SUFFIXES = (".py", ".sh")


def find(part: str, dirs: Sequence[Path], exists: Callable[[Path], bool] = Path.exists) -> Path | None:
    """``part`` in the first of ``dirs`` that has it, for a relative path; None if none has it."""
    if not part or part.startswith(("-", "/")):
        return None
    return next((d / part for d in dirs if exists(d / part)), None)


def missing(spec: Spec, dirs: Sequence[Path], exists: Callable[[Path], bool] = Path.exists) -> list[str]:
    """One line per script named in ``spec.command``/``spec.args`` that none of ``dirs`` holds: the field,
    the value and where it was looked for."""
    where = " nor ".join(str(d) for d in dict.fromkeys(dirs))
    out = []
    argv = [
        (field, i, part)
        for field, parts in (("command", spec.command), ("args", spec.args))
        for i, part in enumerate(parts or ())
    ]
    for n, (field, i, part) in enumerate(argv):
        if (n > 0 and argv[n - 1][2] == "-c") or not is_path(part):
            continue  # a command string (sh -c, python -c) or a word with spaces: run as written
        if (
            part.endswith(SCRIPT_SUFFIXES)
            and not part.startswith(("-", "/"))
            and not find(part, dirs, exists)
        ):
            out.append(f"spec.{field}[{i}]: {part!r} is not a file in {where}")
    return out


def is_path(part: str) -> bool:
    """Whether an argument can be a path here: no whitespace (a shell command string has some)."""
    return bool(part) and not any(c.isspace() for c in part)
