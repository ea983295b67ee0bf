"""Shared fixtures: a small real task written with the project's own writer, and a tiny SFT base policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.tasks import Task, task_toml, write_task
from flywheel.tasks.patch import make_patch

ROOT = Path(__file__).resolve().parents[1]

GOOD = '''def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
'''
BUGGY = GOOD.replace("if x > hi:", "if x >= hi + 1:")
VISIBLE = """from mathx import clamp


def test_clamp_high():
    assert clamp(5.5, 0, 5) == 5
"""
HIDDEN = (
    VISIBLE
    + """

def test_clamp_low():
    assert clamp(-1, 0, 5) == 0


def test_clamp_inside():
    assert clamp(3, 0, 5) == 3
"""
)


def build_clamp_task(dest: Path) -> Task:
    """A one-function task: `clamp` lets values slightly above `hi` through."""
    return write_task(
        dest,
        toml=task_toml(
            id="clamp-1",
            instruction="clamp(5.5, 0, 5) returns 5.5; values above the upper bound should be clamped to it.",
            test_command="python -m pytest -q tests",
            fail_to_pass=["tests/test_mathx.py::test_clamp_high"],
            pass_to_pass=["tests/test_mathx.py::test_clamp_low", "tests/test_mathx.py::test_clamp_inside"],
            timeout_s=30,
            meta={"split": "train"},
        ),
        repo={"mathx.py": BUGGY, "tests/test_mathx.py": VISIBLE},
        hidden_tests={"tests/test_mathx.py": HIDDEN},
        solution_patch=make_patch({"mathx.py": BUGGY}, {"mathx.py": GOOD}),
    )


@pytest.fixture
def clamp_task(tmp_path: Path) -> Task:
    return build_clamp_task(tmp_path / "tasks" / "clamp-1")


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny base policy from `flywheel sft configs/sft-quick.toml` (real imitation data, real training),
    built once per test run."""
    from flywheel.settings import load_config
    from flywheel.sft import SftConfig, run_sft

    cfg = load_config(ROOT / "configs" / "sft-quick.toml", SftConfig)
    return run_sft(cfg, tmp_path_factory.mktemp("sft") / "base")


@pytest.fixture(scope="session")
def one_step_run(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step `flywheel train` of configs/quick.toml on `base`, with TensorBoard events when the package
    is installed: the run directory the TensorBoard and report tests read, built once per test run."""
    import importlib.util

    from flywheel.rl.config import load_config
    from flywheel.rl.train import train

    cfg = load_config(ROOT / "configs" / "quick.toml")
    cfg.model.path, cfg.train.steps = str(base), 1
    cfg.train.tensorboard = importlib.util.find_spec("tensorboard") is not None
    out = tmp_path_factory.mktemp("train") / "run"
    train(cfg, out)
    return out


@pytest.fixture(scope="session")
def _offline_env_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from local_wheels import standard_wheels

    base = tmp_path_factory.mktemp("offline-envs")
    return standard_wheels(base / "wheels"), base / "cache"


@pytest.fixture
def offline_envs(_offline_env_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Environment builds from the tests' own wheels (no package index), in one cache for the session;
    returns the wheel directory (`local_wheels.make_wheel` may add to it)."""
    wheels, cache = _offline_env_dirs
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("FLYWHEEL_ENV_CACHE", str(cache))
    for name in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_INDEX", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    return wheels
