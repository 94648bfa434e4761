"""The no-code-change hook (ddp_trainer.hook.autoinstrument, installed by ``python -m ddp_trainer.inject``) on
scripts with no ddpjob code, under torchrun with 2 ranks on gloo (tests/helpers/autoinstrument_scenarios.py):
it never changes training, needs only torch, leaves a script without DDP alone, fails fast and names the
cause when ranks take different numbers of steps, checks two DDP models, and never checks twice."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_trainer import contract, inject
from helpers import REPO
from testcluster.ci import skip_or_fail

HERE = REPO / "tests" / "helpers"  # the scenarios, and the modules they import, on the ranks' PYTHONPATH
SCENARIOS = HERE / "autoinstrument_scenarios.py"
IMPORT_ORDERS = HERE / "import_orders.py"
EXAMPLES = REPO / "examples"
HIDE = 'raise ModuleNotFoundError("No module named {0} (hidden: an image with torch alone)", name="{0}")\n'


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the init container puts in the pod's shared volume."""
    dest = tmp_path_factory.mktemp("ddpjob-sync")
    assert inject.main([str(dest)]) == 0
    return dest


@pytest.fixture(scope="module")
def torch_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that, on PYTHONPATH, makes NumPy and Numba fail to import, as in an image without them."""
    folder = tmp_path_factory.mktemp("torch-only")
    for name in ("numpy", "numba"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(HIDE.format(name))
    return folder


def torchrun(
    tmp: Path,
    script: Path | str,
    *args: str,
    path: list[Path],
    env: dict[str, str] | None = None,
    module: bool = False,
) -> tuple[int, str, float]:
    """2 ranks of ``script`` (standalone rendezvous; ``module``: a module's name, run as ``torchrun -m``);
    the exit code, the output and the wall time."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DDPJOB_", "PYTHONPATH", "RANK", "LOCAL_RANK"))
    }
    full = {
        **clean,
        "PYTHONPATH": os.pathsep.join(str(p) for p in path),
        "DDPJOB_TERMINATION_LOG": str(tmp / "report.json"),
        "DDPJOB_SYNC_EVERY": "5",
        "DDPJOB_METRICS_PORT": "0",
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    started = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *(["-m"] if module else []),
        str(script),
        *args,
    ]
    done = subprocess.run(cmd, env=full, cwd=tmp, capture_output=True, text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def report(tmp: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp / "report.json").read_text())
    return data


pytestmark = pytest.mark.slow


def test_parameters_are_bit_identical_with_and_without_the_hook(
    tmp_path: Path, hook_dir: Path, torch_only: Path
) -> None:
    """20 AdamW steps of a model with BatchNorm (DDP broadcasts its buffers), each rank its own data: the
    final parameters and buffers are equal bit for bit; with the hook in an image without NumPy or Numba
    the check takes the pure torch path, and runs."""
    (tmp_path / "without").mkdir()
    (tmp_path / "with").mkdir()
    # plain torch aborts a finished gloo rank at exit now and then (docs/your-code.md); that is not this
    # test's subject, so the run without the hook waits at exit as the hook does
    code, out, _ = torchrun(
        tmp_path / "without", SCENARIOS, "plain", "final.pt", path=[], env={"SETTLE_AT_EXIT": "0.2"}
    )
    assert code == 0, out
    assert "ddpjob sync health" not in out and not (tmp_path / "without" / "report.json").exists()
    code, out, _ = torchrun(tmp_path / "with", SCENARIOS, "plain", "final.pt", path=[hook_dir, torch_only])
    assert code == 0, out
    assert "CPU tensors take the torch path" in out, out
    assert "checking 1 DDP model(s): Sequential (built at autoinstrument_scenarios.py:" in out, out
    rep = report(tmp_path / "with")
    assert (rep["result"], rep["checks"], rep["step"], rep["verified"]) == ("Succeeded", 5, 20, True), rep
    plain = torch.load(tmp_path / "without" / "final.pt")
    hooked = torch.load(tmp_path / "with" / "final.pt")
    assert list(plain) == list(hooked) and "module.1.running_mean" in plain
    different = [k for k in plain if not torch.equal(plain[k], hooked[k])]
    assert not different, f"the hook changed training: {different}"


# an image's start-up that imports torch before the hook's sitecustomize runs (as a .pth file in its
# site-packages would), then runs the hook's, as Python would have had it come first
PRELOAD = """import builtins
import importlib.util

if not getattr(builtins, "_ddpjob_test_preloaded", False):
    builtins._ddpjob_test_preloaded = True
    import torch

    spec = importlib.util.spec_from_file_location("sitecustomize", {hook!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
"""


@pytest.mark.parametrize(
    "head", ["transformers", "datasets", "accelerate", "find_spec", "import_module", "-m", "preloaded"]
)
def test_the_hook_switches_on_however_torch_arrives(tmp_path: Path, hook_dir: Path, head: str) -> None:
    """The same plain DDP script (tests/helpers/import_orders.py), its head importing torch the ways public
    scripts do: a real framework first (transformers, datasets, accelerate: each probes
    ``importlib.util.find_spec("torch")`` or imports torch for the script), the probe alone,
    ``importlib.import_module``, the script run as a module (``torchrun -m``), torch loaded before the
    hook's ``sitecustomize`` ran. Each ends checked and verified."""
    if head == "datasets" and importlib.util.find_spec("datasets") is None:
        skip_or_fail("datasets is not installed (pip install -e '.[dev]' installs it)")
    path, env = [hook_dir, HERE], {"HEAD": head, "STEPS": "10"}
    if head == "preloaded":
        (tmp_path / "image").mkdir()
        (tmp_path / "image" / "sitecustomize.py").write_text(
            PRELOAD.format(hook=str(hook_dir / "sitecustomize.py"))
        )
        path = [tmp_path / "image", hook_dir]
    if head == "-m":
        code, out, _ = torchrun(tmp_path, "import_orders", path=path, env=env, module=True)
    else:
        code, out, _ = torchrun(tmp_path, IMPORT_ORDERS, path=path, env=env)
    assert code == 0, out
    assert "ddpjob sync health: checking 1 DDP model(s): Sequential (built at import_orders.py:" in out, out
    rep = report(tmp_path)
    assert (rep["result"], rep["checks"], rep["step"], rep["verified"]) == ("Succeeded", 3, 10, True), rep


def test_a_script_without_ddp_runs_untouched_and_says_so_once(tmp_path: Path, hook_dir: Path) -> None:
    code, out, _ = torchrun(tmp_path, SCENARIOS, "no-ddp", "final.pt", path=[hook_dir])
    assert code == 0, out
    assert out.count("ddpjob sync health:") == 1, out
    assert "ddpjob sync health: no DDP model was seen in this process: nothing was checked" in out, out
    rep = report(tmp_path)  # "nothing to verify", not "no report" (which means it crashed first)
    assert (rep["result"], rep["reason"], rep["worldSize"]) == ("Succeeded", "NoDDPModel", 2), rep
    assert "checks" not in rep and "verified" not in rep, rep


def test_the_hooks_lines_stay_out_of_the_scripts_own_log_file_and_come_once_from_rank_0(
    tmp_path: Path, hook_dir: Path
) -> None:
    """A script that configures its own logging first (``logging.basicConfig(filename=...)``, INFO, every
    rank into one file: tests/helpers/own_logging.py): none of the hook's lines in that file; each check
    once on stderr, from rank 0 (issue 58, item 1)."""
    own = tmp_path / "main.log"
    code, out, _ = torchrun(tmp_path, HERE / "own_logging.py", "--log-file", str(own), path=[hook_dir])
    assert code == 0, out
    mine = own.read_text()
    assert "rank 0 step 10 loss" in mine and "rank 1 step 10 loss" in mine, mine
    assert "ddp_trainer" not in mine and "check passed" not in mine, mine
    for kind in ("step 0: initial", "step 5: periodic", "step 10: periodic"):
        assert out.count(f"{kind} check passed (") == 1, out
        assert f"[rank 0] INFO {kind} check passed (" in out, out
    assert "[rank 1]" not in out, out


def test_a_ddp_model_no_optimizer_stepped_is_the_reason_in_the_report_and_the_summary(
    tmp_path: Path, hook_dir: Path
) -> None:
    """A script that resumed at its last epoch builds its DDP model and takes no step (issue 58, item 2):
    the hook says so, and that is the report's reason and the summary's sentence, not "not reported"."""
    from ddp_operator.observe import sync_report

    code, out, _ = torchrun(tmp_path, SCENARIOS, "resumed-at-the-end", "final.pt", path=[hook_dir])
    assert code == 0, out
    assert out.count(f"ddpjob sync health: {contract.NOT_STEPPED_MESSAGE}") == 1, out
    rep = report(tmp_path)
    assert (rep["result"], rep["reason"], rep["message"]) == (
        contract.SUCCEEDED,
        contract.NOT_STEPPED,
        contract.NOT_STEPPED_MESSAGE,
    ), rep
    assert sync_report.sync_sentence(rep) == contract.NOT_STEPPED_MESSAGE


def test_ranks_that_take_different_numbers_of_steps_fail_in_seconds_naming_the_cause(
    tmp_path: Path, hook_dir: Path
) -> None:
    """Rank 1 takes a 21st optimizer step alone: the ranks meet at the end-of-run agreement with steps 20
    and 21 and both stop, saying so, long before gloo's 30-minute collective timeout."""
    code, out, seconds = torchrun(tmp_path, SCENARIOS, "uneven", "final.pt", path=[hook_dir])
    assert code != 0, out
    assert "the ranks are at different steps (from 20 to 21" in out, out
    assert "they took different numbers of optimizer steps" in out, out
    assert seconds < 60, f"took {seconds:.0f} s"
    rep = report(tmp_path)
    assert rep["result"] == "Failed" and "different steps" in rep["message"], rep


def test_two_ddp_models_are_both_checked(tmp_path: Path, hook_dir: Path) -> None:
    """A fault in the second of two DDP models (rank 1, step 7) is caught at step 10, named ``ddp1.…``."""
    code, out, _ = torchrun(
        tmp_path, SCENARIOS, "two-models", "final.pt", path=[hook_dir], env={"NUDGE_SECOND": "1"}
    )
    assert code != 0, out
    assert "checking 2 DDP model(s): ddp0 = Sequential (built at" in out and "ddp1 = Sequential" in out, out
    rep = report(tmp_path)
    assert (rep["result"], rep["reason"], rep["lastCheckStep"]) == ("Diverged", "SyncDivergence", 10), rep
    assert rep["mismatchedTensors"] == ["ddp1.0.weight"] and rep["divergedRanks"] == [1], rep


def test_a_compiled_model_is_checked_and_named_by_its_own_class(tmp_path: Path, hook_dir: Path) -> None:
    """``DDP(torch.compile(model))``, as nanoGPT builds it: checked, and the line names ``Sequential``,
    not torch.compile's ``OptimizedModule``."""
    code, out, _ = torchrun(tmp_path, SCENARIOS, "compiled", "final.pt", path=[hook_dir])
    assert code == 0, out
    assert "checking 1 DDP model(s): Sequential (built at" in out, out
    rep = report(tmp_path)
    assert (rep["result"], rep["reason"], rep["lastCheckStep"]) == ("Succeeded", "AllChecksPassed", 20), rep


def test_a_script_that_checks_itself_is_not_checked_twice(tmp_path: Path, hook_dir: Path) -> None:
    code, out, _ = torchrun(tmp_path, EXAMPLES / "plain_loop.py", path=[hook_dir], env={"STEPS": "10"})
    assert code == 0, out
    assert "the hook stands down" in out, out
    assert report(tmp_path)["checks"] == 3, report(tmp_path)  # the script's own: initial, 5, 10


def test_a_training_process_waits_for_gloos_threads_before_the_interpreter_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's gloo threads release a finished collective after its caller woke up; in an interpreter
    already finalizing that aborts the process (distributed.GLOO_SETTLE_SECONDS). The hook's exit handler
    (and SyncHealth's, registered once) wait for them in a process that trained; others do not wait."""
    from ddp_trainer.core import distributed
    from ddp_trainer.hook import autoinstrument

    settled: list[float] = []
    monkeypatch.setattr(distributed, "settle_gloo", lambda: settled.append(distributed.GLOO_SETTLE_SECONDS))
    idle = autoinstrument.AutoSync()
    idle.at_exit()
    assert settled == []
    trained = autoinstrument.AutoSync()
    trained.distributed = True
    trained.at_exit()
    assert settled == [distributed.GLOO_SETTLE_SECONDS]

    registered: list[Any] = []
    monkeypatch.setattr(distributed, "_settling", False)
    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    distributed.settle_gloo_at_exit()
    distributed.settle_gloo_at_exit()
    assert registered == [distributed.settle_gloo]


def test_a_hook_that_cannot_switch_on_reports_why_for_the_status(
    tmp_path: Path, hook_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook's own report when it cannot install (local rank 0 only; a report already there stays): the
    operator shows its message in SyncVerified (reason SyncHookOff) instead of "not reported"."""
    import importlib.util

    from ddp_operator.observe import sync_report

    spec = importlib.util.spec_from_file_location("hook_sitecustomize", hook_dir / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # not named sitecustomize: defines its functions, starts nothing
    log = tmp_path / "report.json"
    monkeypatch.setenv("DDPJOB_TERMINATION_LOG", str(log))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    hook._report_off("ImportError: cannot import name 'x'")
    assert not log.exists()  # only the pod's local rank 0 writes
    monkeypatch.setenv("LOCAL_RANK", "0")
    hook._report_off("ImportError: cannot import name 'x'")
    rep = json.loads(log.read_text())
    assert (rep["result"], rep["reason"], rep["worldSize"]) == ("Succeeded", "SyncHookOff", 4), rep
    assert (
        rep["message"]
        == "the sync hook could not switch on: ImportError: cannot import name 'x'; nothing was verified"
    )
    assert sync_report.sync_sentence(rep) == f"not checked: {rep['message']}"
    hook._report_off("another reason")
    assert json.loads(log.read_text()) == rep  # the first report stays


def test_the_hook_gives_a_training_process_what_cublas_needs_for_the_probe(hook_dir: Path) -> None:
    """``CUBLAS_WORKSPACE_CONFIG`` is set at the process's start (before torch, so before cuBLAS), in a
    training process only, and a value of the user's stays; the hook's copy equals the contract's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hook_sitecustomize", hook_dir / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.CUBLAS_WORKSPACE == (contract.CUBLAS_WORKSPACE_ENV, contract.CUBLAS_WORKSPACE)

    def seen(**env: str) -> str:
        base = {
            k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "CUBLAS_WORKSPACE_CONFIG")
        }
        code = "import os; print(os.environ.get('CUBLAS_WORKSPACE_CONFIG', '-'))"
        env = {**base, "PYTHONPATH": str(hook_dir), **env}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout.strip()

    assert seen(RANK="0") == contract.CUBLAS_WORKSPACE
    assert seen(RANK="0", CUBLAS_WORKSPACE_CONFIG=":16:8") == ":16:8"
    assert seen() == "-"  # not a training process: nothing set
