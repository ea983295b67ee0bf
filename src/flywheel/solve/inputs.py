"""The input of `solve`: the repository's snapshot (`snapshot`, without `SKIP`), its test command
(`find_test_command`), its environment (`repo_environment`: what it declares, plus a requirements file),
the ad-hoc task on it (`solve_task`), and the checks that refuse bad input in one line before anything
runs (`check_inputs`, `refuse_scripted`).
"""

from __future__ import annotations

import configparser
import shutil
import tomllib
from pathlib import Path

from flywheel.errors import FlywheelError
from flywheel.models import SCRIPTED
from flywheel.protocols import Environment
from flywheel.tasks.declared import declared_requirements, read_requirements
from flywheel.tasks.format import Task

# what never reaches the sandbox: history, caches, environments, build output
SKIP = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    "node_modules",
    ".eggs",
    "*.egg-info",
    "*.pyc",
)
NO_TESTS = "echo 'no test command: none was found or given (flywheel solve --test-command)'; exit 1"


def find_test_command(repo: Path) -> str | None:
    """pytest where the repository shows it uses pytest (a `tests/` directory, pytest.ini, a pytest
    section in pyproject.toml, setup.cfg or tox.ini); else None."""
    if (repo / "tests").is_dir() or (repo / "pytest.ini").is_file() or _pytest_configured(repo):
        return "python -m pytest -q"
    return None


def _pytest_configured(repo: Path) -> bool:
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            if "pytest" in tomllib.loads(pyproject.read_text()).get("tool", {}):
                return True
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            pass
    for name in ("setup.cfg", "tox.ini"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(repo / name)
        except (configparser.Error, UnicodeDecodeError):
            continue
        if any(s in parser for s in ("pytest", "tool:pytest")):
            return True
    return False


def check_inputs(repo: Path, instruction: str, out: Path | None) -> None:
    """Refuse bad input before anything runs (FlywheelError, one line)."""
    if not repo.is_dir():
        raise FlywheelError(f"{repo}: not a directory")
    if not instruction.strip():
        raise FlywheelError("the instruction is empty: say what the agent should do")
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FlywheelError(f"{out} exists: choose another --out")


def repo_environment(repo: Path, requirements: Path | None = None, use_env: bool = True) -> Environment:
    """The environment `solve` runs `repo` in: what the repository declares (`declared_requirements`),
    then the lines of the requirements file `requirements`; `use_env` False: none (the project's own
    Python), and then a requirements file is refused. Bad input is one FlywheelError line."""
    if not use_env:
        if requirements is not None:
            raise FlywheelError(
                "--requirements adds to the repository's environment, which --no-env turns off"
            )
        return Environment()
    try:
        declared = declared_requirements(repo)
    except FlywheelError as e:
        raise FlywheelError(f"{repo}: {e}") from None
    added: list[str] = []
    if requirements is not None:
        if not requirements.is_file():
            raise FlywheelError(f"--requirements {requirements}: no such file")
        try:
            added = read_requirements(requirements)
        except FlywheelError as e:
            raise FlywheelError(f"--requirements {requirements}: {e}") from None
    return Environment(requirements=tuple(dict.fromkeys([*declared, *added])))


def refuse_scripted(**specs: str | None) -> None:
    """Refuse a scripted model for any role (`model=`, `lead=`, `sidekick=`, named as `--model` ...): they
    replay a task's reference fix, and a repository has none."""
    for role, spec in specs.items():
        if spec in (*SCRIPTED, "scripted-lead", "scripted-sweep-lead"):
            raise FlywheelError(
                f"--{role} {spec}: the scripted models replay a task's reference fix, and a repository has none; "
                "use a trained model (toybugs-sweep, hf:DIR) or openai:NAME"
            )


def snapshot(repo: Path, dest: Path) -> None:
    """Copy `repo`'s working tree to `dest`, without `SKIP` (history, caches, environments)."""
    shutil.copytree(repo, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIP))


def solve_task(
    root: Path,
    instruction: str,
    test_command: str | None,
    timeout_s: float = 600.0,
    environment: Environment = Environment(),
) -> Task:
    """The ad-hoc task on the snapshot at `root/repo`, in `environment`: no hidden tests, no reference fix."""
    return Task(
        id="solve",
        instruction=instruction,
        test_command=test_command or NO_TESTS,
        fail_to_pass=(),
        pass_to_pass=(),
        timeout_s=timeout_s,
        root=root,
        meta={"source": "flywheel solve"},
        environment=environment,
    )
