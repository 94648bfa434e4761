"""podlogs.first_error: the failing rank's first error, not torchrun's generic tail."""

from __future__ import annotations

from ddp_operator.observe.podlogs import first_error

# The shape of a real `torchrun --nproc-per-node 2 boom.py` (torch 2.15) where rank 1 raised and rank 0
# then lost its peer; cut down.
TORCHRUN = """\
W1123 15:28:19.694000 17001 torch/distributed/run.py:982] Setting OMP_NUM_THREADS environment variable
[rank0]: Traceback (most recent call last):
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/boom.py", line 4, in f
[rank0]:   File "/tmp/boom.py", line 6, in <module>
[rank1]:     raise RuntimeError("the real cause")
[rank0]:     dist.barrier()
[rank0]: RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:3996.
[rank1]: RuntimeError: the real cause
E1123 15:28:25.936000 17001 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 17011)
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 6, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
boom.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_15:28:25
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 17011)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_root_cause_ranks_traceback_comes_first() -> None:
    assert first_error(TORCHRUN.splitlines()) == [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/tmp/boom.py", line 4, in f',
        '[rank1]:     raise RuntimeError("the real cause")',
        "[rank1]: RuntimeError: the real cause",
    ]


def test_without_a_root_cause_the_first_traceback() -> None:
    lines = [line for line in TORCHRUN.splitlines() if "rank      :" not in line]
    assert first_error(lines)[-1].startswith("[rank0]: RuntimeError: [pair.cc:561] Connection closed")


def test_a_usage_error_is_one_line() -> None:
    lines = [
        "[rank0]: usage: python -m ddp_trainer [-h] [--device {auto,cuda,cpu}]",
        "[rank0]:                              [--steps STEPS]",
        "[rank0]: python -m ddp_trainer: error: unrecognized arguments: --stepz=10",
        *TORCHRUN.splitlines()[10:],
    ]
    assert first_error(lines) == ["[rank0]: python -m ddp_trainer: error: unrecognized arguments: --stepz=10"]


def test_a_plain_script_and_a_long_traceback() -> None:
    frames = [f'  File "/x.py", line {n}, in f{n}\n    f{n + 1}()' for n in range(30)]
    lines = "\n".join(["Traceback (most recent call last):", *frames, "KeyError: 'RANK'"]).splitlines()
    shown = first_error(lines, limit=8)
    assert (
        len(shown) == 8 and shown[0] == lines[0] and shown[1] == "  ..." and shown[-1] == "KeyError: 'RANK'"
    )


def test_only_the_launchers_traceback_or_nothing() -> None:
    assert first_error(TORCHRUN.splitlines()[9:]) == []
    assert first_error(["all good", "step 10"]) == []
