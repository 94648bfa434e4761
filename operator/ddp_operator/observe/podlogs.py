"""The first error in a pod's output: what a person needs when a pod failed. Pure.

torchrun ends a failed run with its own generic block ("Root Cause (first observed failure) … To enable
traceback see …"); the real cause (argparse's ``error: unrecognized arguments``, the worker's traceback)
is further up. This finds the first of them: in a pod's termination message (the operator's ``observe``)
and in a local pod's log file (``ddpjob local``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_USAGE = re.compile(r"^\S.*: error: ")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")
_TRACEBACK = "Traceback (most recent call last):"
_LAUNCHER = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_ROOT_CAUSE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")


def first_error(lines: Sequence[str], limit: int = 16) -> list[str]:
    """The failing rank's first usage error or traceback in ``lines``, as printed, at most ``limit`` lines
    (a long traceback keeps its head and its end, where the exception is); ``[]`` when there is none.

    torchrun prefixes each worker's lines with ``[rankN]:``; the rank its "Root Cause" block names is
    searched first, then every other output in the order its errors appear. torchrun's own
    ``ChildFailedError`` traceback is never the answer."""
    ranks = [_rank_of(line) for line in lines]
    order = sorted(set(ranks), key=lambda rank: (rank != _root_cause(lines), _first_mark(lines, ranks, rank)))
    for rank in order:
        own = [line for line, of in zip(lines, ranks, strict=True) if of == rank]
        found = _first_in(own)
        if found:
            return found if len(found) <= limit else [found[0], "  ...", *found[-(limit - 2) :]]
    return []


def _rank_of(line: str) -> int | None:
    match = _RANK_PREFIX.match(line)
    return int(match[1]) if match else None


def strip_rank(line: str) -> str:
    """A line without torchrun's ``[rankN]:`` prefix."""
    return _RANK_PREFIX.sub("", line, count=1)


_text = strip_rank


def _root_cause(lines: Sequence[str]) -> int | None:
    """The rank torchrun names as the root cause (its first observed failure), if it says so."""
    for index, line in enumerate(lines):
        if line.startswith("Root Cause"):
            for after in lines[index + 1 : index + 8]:
                if match := _ROOT_CAUSE_RANK.match(after):
                    return int(match[1])
    return None


def _first_mark(lines: Sequence[str], ranks: Sequence[int | None], rank: int | None) -> int:
    for index, (line, of) in enumerate(zip(lines, ranks, strict=True)):
        text = _text(line)
        if of == rank and (text.strip() == _TRACEBACK or _USAGE.match(text)):
            return index
    return len(lines)


def _first_in(lines: Sequence[str]) -> list[str]:
    for index, line in enumerate(lines):
        text = _text(line)
        if _USAGE.match(text):
            return [line]
        if text.strip() == _TRACEBACK:
            block = _traceback(lines, index)
            if block and not _text(block[-1]).startswith(_LAUNCHER):
                return block
    return []


def _traceback(lines: Sequence[str], start: int) -> list[str]:
    """The traceback that begins at ``lines[start]``, through its exception line (the first line after it
    that is not indented)."""
    block = [lines[start]]
    for line in lines[start + 1 : start + 400]:
        block.append(line)
        text = _text(line)
        if text and not text[0].isspace() and _EXCEPTION.match(text.split(":", 1)[0]):
            return block
    return []
