"""``python -m ddp_trainer.inject`` (the init container's command) and the ``sitecustomize`` it installs:
what a process that is not a training rank pays (no torch import, nothing printed), that the image's own
``sitecustomize`` still runs, and that the hook waits for the script's own ``import torch``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_trainer import contract, inject


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("ddpjob-sync")
    assert inject.main([str(dest)]) == 0
    return dest


def python(code: str, path: list[Path], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "PYTHONPATH")}
    full = {**clean, "PYTHONPATH": os.pathsep.join(map(str, path)), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_it_copies_the_hook_the_library_and_the_vendored_packages(hook_dir: Path) -> None:
    assert (hook_dir / "sitecustomize.py").read_text().startswith('"""The no-code-change hook')
    assert (hook_dir / "ddp_trainer" / "sync" / "health.py").is_file()
    assert (hook_dir / "ddp_trainer" / "hook" / "autoinstrument.py").is_file()
    assert (hook_dir / "vendor" / "prometheus_client" / "__init__.py").is_file()
    # compiled: the volume is mounted read-only
    assert list((hook_dir / "ddp_trainer" / "sync").glob("__pycache__/health.*.pyc"))


def test_it_refuses_a_missing_destination_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert inject.main([]) == 2
    assert "usage: python -m ddp_trainer.inject DEST" in capsys.readouterr().err


def test_a_process_that_is_not_a_training_rank_is_left_alone(hook_dir: Path) -> None:
    done = python(
        "import sys; print('torch' in sys.modules, sys.modules['sitecustomize'].__file__)", [hook_dir]
    )
    assert done.returncode == 0 and done.stderr == "", done
    assert done.stdout.split() == ["False", str(hook_dir / "sitecustomize.py")]


def test_a_training_rank_waits_for_the_scripts_own_torch_import(hook_dir: Path) -> None:
    """No torch import of its own; once the script imports torch, DDP's constructor is wrapped."""
    code = (
        "import sys; before = 'torch' in sys.modules; import torch; "
        "from torch.nn.parallel import DistributedDataParallel as D; "
        "print(before, getattr(D.__init__, '__ddpjob_hook__', False), "
        "torch.__loader__ is torch.__spec__.loader)"
    )
    done = python(code, [hook_dir], LOCAL_RANK="0")
    assert done.returncode == 0, done
    assert done.stdout.split() == ["False", "True", "True"], done
    assert done.stderr == "", done  # a process that never initialised torch.distributed says nothing


def test_the_images_own_sitecustomize_still_runs(hook_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    done = python(
        "import os; print(os.environ.get('IMAGE_SITECUSTOMIZE'))", [hook_dir, tmp_path], LOCAL_RANK="0"
    )
    assert done.returncode == 0 and done.stdout.strip() == "ran", done


def test_it_can_be_switched_off_in_one_process(hook_dir: Path) -> None:
    code = (
        "import torch; from torch.nn.parallel import DistributedDataParallel as D; "
        "print(hasattr(D.__init__, '__ddpjob_hook__'))"
    )
    done = python(code, [hook_dir], LOCAL_RANK="0", DDPJOB_SYNC_HOOK="0")
    assert done.stdout.strip() == "False", done


def test_the_hook_spells_the_contracts_switch() -> None:
    text = (Path(inject.__file__).parent / "hook" / "bootstrap" / "sitecustomize.py").read_text()
    assert f'"{contract.SYNC_HOOK_OFF_ENV}"' in text
    assert contract.SYNC_HOOK_INSTALL[2] == inject.__name__


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_copies_nothing(tmp_path: Path, flag: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddp_trainer.inject", flag], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m ddp_trainer.inject DEST"), done
    assert list(tmp_path.iterdir()) == [], "the help flag was taken for a folder"
    refused = subprocess.run(
        [sys.executable, "-m", "ddp_trainer.inject", "--dest"], cwd=tmp_path, capture_output=True, text=True
    )
    assert refused.returncode == 2 and list(tmp_path.iterdir()) == [], refused


def test_built_at_names_the_users_frame_not_a_librarys(tmp_path: Path) -> None:
    """DDP built inside an installed library (accelerate, a Trainer) called from the user's script: "built
    at" is the script's line, not the library's."""
    from ddp_trainer.hook import autoinstrument

    library = tmp_path / "site-packages" / "somelib"
    library.mkdir(parents=True)
    (library / "accelerator.py").write_text("def prepare(where):\n    return where()\n")
    script = tmp_path / "train.py"
    script.write_text("import accelerator\n\n\ndef main(where):\n    return accelerator.prepare(where)\n")
    sys.path.insert(0, str(library))
    sys.path.insert(0, str(tmp_path))
    try:
        import train  # type: ignore[import-not-found]

        assert train.main(autoinstrument.caller) == "train.py:5"
    finally:
        sys.path[:2] = []
        sys.modules.pop("train", None)
        sys.modules.pop("accelerator", None)
