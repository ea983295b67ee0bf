"""Harbor tasks that bring their own environment: a Dockerfile's WORKDIR, ENV and `pip install` become the
task's `Environment`, tests that read `/app/...` work, the real grader and the scripted oracle solve the
imported task in an environment built from local wheels (no package index), ours -> Harbor -> ours keeps
the environment, and what still needs a container is refused in one line naming the Dockerfile line."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.harness import EpisodeSpec, HarnessConfig, get_effort, run_episodes
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Environment
from flywheel.sandbox.envs import find_python
from flywheel.tasks import Task, load_task, task_toml, write_task
from flywheel.tasks.interop import docker_plan, export_tasks, import_tasks
from flywheel.tasks.patch import apply_patch_to_dir, make_patch
from flywheel.verify.grader import grade

PY = f"{sys.version_info.major}.{sys.version_info.minor}"  # a Python this host has

HELLO_BUGGY = "import greetlib\n\n\ndef message(name):\n    return greetlib.greet(name).upper()\n"
HELLO_FIXED = "import greetlib\n\n\ndef message(name):\n    return greetlib.greet(name)\n"
HELLO_PATCH = make_patch({"hello.py": HELLO_BUGGY}, {"hello.py": HELLO_FIXED})
HIDDEN_TEST = """import os

import greetlib
from hello import message


def test_message_reads_the_app(fortytwo):
    name = open("/app/data.txt").read().strip()
    assert message(name) == greetlib.greet(name) == "hello world"
    assert os.environ["GREETING"] == "hi" and fortytwo == 42
"""
GREET_FILES = {
    "task.toml": 'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\n\n[verifier]\ntimeout_sec = 120.0\n',
    "instruction.md": "`message(name)` should greet the name as greetlib does, not shout it.\n",
    "environment/Dockerfile": f"""FROM python:{PY}-slim
WORKDIR /app
COPY . /app
RUN pip install greetlib==1.0 -r requirements.txt
ENV GREETING=hi
""",
    "environment/.dockerignore": "Dockerfile\n.dockerignore\n",
    "environment/requirements.txt": "# the tests' plugin\n\npytest-fortytwo==0.1  # gives `fortytwo`\n-r more.txt\n",
    "environment/more.txt": "greetlib>=1.0\n",
    "environment/data.txt": "world\n",
    "environment/hello.py": HELLO_BUGGY,
    "tests/test.sh": "#!/bin/bash\ncd /app\npytest /tests/test_outputs.py\n"
    "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n",
    "tests/test_outputs.py": HIDDEN_TEST,
    "solution/solve.sh": f"#!/bin/bash\ncd /app\ngit apply <<'EOF'\n{HELLO_PATCH}EOF\n",
}
GREET_ENV = Environment(
    requirements=("greetlib==1.0", "pytest-fortytwo==0.1", "greetlib>=1.0"),
    python=PY,
    env=(("GREETING", "hi"),),
    workdir="/app",
)


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def check_python(version: str) -> None:
    find_python(version)


@pytest.fixture
def greet(tmp_path: Path) -> Path:
    """A Harbor task that installs packages (one of them a pytest plugin) and whose tests read /app."""
    return write_files(tmp_path / "harbor" / "hello", GREET_FILES)


@pytest.fixture
def imported(greet: Path, tmp_path: Path) -> Task:
    (task,) = import_tasks("harbor", greet, tmp_path / "ours", check_python=check_python)
    return task


def workspace(task: Task, dest: Path, patched: bool) -> Path:
    shutil.copytree(task.repo, dest)
    if patched:
        apply_patch_to_dir(dest, task.solution_patch)
    return dest


# ------------------------------------------------------------------------------------------- import, graded


def test_the_dockerfile_becomes_the_environment(imported):
    assert imported.environment == GREET_ENV
    assert sorted(p.name for p in imported.repo.iterdir()) == [
        "data.txt",
        "hello.py",
        "more.txt",
        "requirements.txt",
    ]
    assert imported.fail_to_pass == ("test_outputs.py::test_message_reads_the_app",)
    assert "[environment]" in (imported.root / "task.toml").read_text()


def test_the_grader_passes_the_fix_and_fails_the_repository(imported, tmp_path, offline_envs):
    fixed = grade(imported, workspace(imported, tmp_path / "fixed", patched=True))
    assert fixed.success and fixed.error is None, fixed
    broken = grade(imported, workspace(imported, tmp_path / "broken", patched=False))
    assert not broken.success and broken.error is None, broken
    assert broken.tests == {"test_outputs.py::test_message_reads_the_app": "failed"}


def test_the_scripted_oracle_solves_it_end_to_end(imported, offline_envs):
    [rec] = run_episodes(
        [EpisodeSpec(imported, get_effort("medium"))], ScriptedModel(), cfg=HarnessConfig(), concurrency=1
    )
    assert rec.ending == "submitted" and rec.success and rec.verdict.success, rec.verdict


# ------------------------------------------------------------------------------------------- export


def test_ours_to_harbor_to_ours_keeps_the_environment(imported, tmp_path):
    export_tasks("harbor", [imported], tmp_path / "h")
    d = tmp_path / "h" / imported.id
    dockerfile = (d / "environment" / "Dockerfile").read_text().splitlines()
    assert dockerfile[2:] == [
        f"FROM python:{PY}-slim",
        f"RUN pip install --no-cache-dir pytest=={pytest.__version__}",
        "RUN pip install --no-cache-dir greetlib==1.0 pytest-fortytwo==0.1 'greetlib>=1.0'",
        'ENV GREETING="hi"',
        "WORKDIR /app",
        "COPY . /app/",
    ]
    ours = tomllib.loads((d / "task.toml").read_text())["metadata"]["flywheel"]
    assert ours["environment"] == {
        "requirements": list(GREET_ENV.requirements),
        "python": PY,
        "workdir": "/app",
        "env": {"GREETING": "hi"},
    }
    assert "cd /app" in (d / "tests" / "test.sh").read_text()
    (back,) = import_tasks("harbor", tmp_path / "h", tmp_path / "back")
    assert back.environment == imported.environment
    assert (back.repo / "hello.py").read_text() == HELLO_BUGGY and back.solution_patch == HELLO_PATCH
    assert back.fail_to_pass == imported.fail_to_pass and dict(back.meta) == dict(imported.meta)


def test_an_exported_dockerfile_reads_back_as_the_same_environment(tmp_path):
    """Without [metadata.flywheel], the Dockerfile alone gives the environment back: variables with
    quotes, `$` and spaces, markers in requirements, a workdir other than /app, the running Python."""
    env = Environment(
        requirements=("greetlib>=1.0,<3", 'pytest-fortytwo; python_version >= "3"'),
        env=(("MSG", 'say "$HOME" \\ twice'), ("TZ", "UTC")),
        workdir="/testbed",
    )
    task = write_task(
        tmp_path / "t" / "env-1",
        toml=task_toml(
            id="env-1",
            instruction="Fix it.",
            test_command="python -m pytest -q",
            fail_to_pass=["test_hello.py::test_message_reads_the_app"],
            pass_to_pass=[],
            timeout_s=60,
            environment=env,
        ),
        repo={"hello.py": HELLO_BUGGY},
        hidden_tests={"test_hello.py": HIDDEN_TEST},
        solution_patch=HELLO_PATCH,
    )
    export_tasks("harbor", [task], tmp_path / "h")
    d = tmp_path / "h" / "env-1"
    plan = docker_plan((d / "environment" / "Dockerfile").read_text(), {})
    assert plan.environment == Environment(
        requirements=(f"pytest=={pytest.__version__}", *env.requirements),
        python=PY,  # the exported image is the running Python's
        env=env.env,
        workdir="/testbed",
    )
    (back,) = import_tasks("harbor", tmp_path / "h", tmp_path / "back")
    assert back.environment == env and load_task(back.root).environment == env


# ------------------------------------------------------------------------------------------- what the reader reads


def test_the_reader_reads_pip_env_and_path_forms(tmp_path):
    context = write_files(
        tmp_path / "ctx",
        {
            "reqs/base.txt": "--requirement=../reqs/extra.txt\nalpha==1 \\\n    --hash=sha256:00\n",
            "reqs/extra.txt": "beta[fast]>=2; python_version >= '3'\n",
            "pyproject.toml": '[project]\nname = "me"\ndependencies = ["gamma"]\n'
            '[project.optional-dependencies]\ntest = ["delta"]\nall = ["me[test]", "epsilon"]\n',
        },
    )
    files = {p.relative_to(context).as_posix(): p for p in context.rglob("*") if p.is_file()}
    text = f"""FROM docker.io/library/python:{PY}.1-slim-bookworm AS base
ARG TOOL=zeta
ENV A=1 B="two words" PYTHONUNBUFFERED=1
ENV C three words
ENV D=${{TOOL}}-x E=${{NOPE:-fallback}}
ENV PATH=/usr/local/bin:/srv/app/bin:$PATH
WORKDIR /srv/app
COPY . .
RUN pip3 install --upgrade pip && uv pip install --system -q "$TOOL" 2>&1 \\
 && pip install -e '.[all]' ; mkdir -p /srv/app/out \\
 && cd reqs && python3 -m pip install --no-cache-dir --progress-bar off -r base.txt
"""
    plan = docker_plan(text, files)
    assert plan.environment == Environment(
        requirements=(
            "zeta",
            "beta[fast]>=2; python_version >= '3'",
            "alpha==1",
            "gamma",
            "epsilon",
            "delta",
        ),
        python=PY,
        env=(("A", "1"), ("B", "two words"), ("C", "three words"), ("D", "zeta-x"), ("E", "fallback")),
        workdir="/srv/app",
    )


@pytest.mark.parametrize(
    "base,python",
    [("python:3-slim", None), ("python", None), ("ubuntu:24.04", None), ("python:3.11.7-alpine", "3.11")],
)
def test_the_base_image_names_the_python(base, python):
    assert docker_plan(f"FROM {base}\nWORKDIR /app\n", {}).environment.python == python


# ------------------------------------------------------------------------------------------- refusals

DOCKERFILE = f"FROM python:{PY}-slim\nWORKDIR /app\nCOPY . /app\n"


@pytest.mark.parametrize(
    "rel,text,message",
    [
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN apk add --no-cache git\n",
            "needs its own Docker environment (environment/Dockerfile line 4: RUN apk add --no-cache git: "
            "system packages); flywheel runs tasks without Docker",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install -r requirements.txt && apt install -y jq\n",
            "needs its own Docker environment (environment/Dockerfile line 4: RUN apt install -y jq: "
            "system packages); flywheel runs tasks without Docker",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN yum install -y gcc\n",
            "environment/Dockerfile line 4: RUN yum install -y gcc: system packages",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN dnf install -y gcc\n",
            "environment/Dockerfile line 4: RUN dnf install -y gcc: system packages",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN make build\n",
            "needs its own Docker environment (environment/Dockerfile line 4: RUN make build); "
            "flywheel runs tasks without Docker",
        ),
        (
            "environment/Dockerfile",
            "FROM node:20-slim\nWORKDIR /app\n",
            "needs its own Docker environment (environment/Dockerfile line 1: base image node:20-slim is "
            "neither python nor a bare OS); flywheel runs tasks without Docker",
        ),
        (
            "environment/Dockerfile",
            f"FROM python:{PY} AS build\nFROM python:{PY}-slim\nWORKDIR /app\n",
            "needs its own Docker environment (environment/Dockerfile line 2: a multi-stage build)",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "COPY --from=builder /wheels /wheels\n",
            "needs its own Docker environment (environment/Dockerfile line 4: COPY from another image or "
            "stage)",
        ),
        (
            "environment/Dockerfile",
            "FROM python:2.7\nWORKDIR /app\n",
            "needs its own Docker environment (environment/Dockerfile line 1: base image python:2.7 is not a "
            "Python 3 image)",
        ),
        (
            "environment/Dockerfile",
            "FROM python:3.99-slim\nWORKDIR /app\n",
            "environment/Dockerfile line 1: base image python:3.99-slim: python 3.99 is not on this host",
        ),
        (
            "environment/Dockerfile",
            f"FROM python:{PY}\nWORKDIR /usr/src/app\nCOPY . .\n",
            "environment/Dockerfile line 2: 'workdir' /usr/src/app overlaps /usr, which the sandbox needs",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "ENV PATH=/opt/tools/bin:$PATH\n",
            "environment/Dockerfile line 4: ENV PATH=/opt/tools/bin:$PATH does more than put directories "
            "under WORKDIR or /usr/local/bin before $PATH; the sandbox owns PATH",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "ENV PATH=/app/bin\n",
            "environment/Dockerfile line 4: ENV PATH=/app/bin does more than put directories",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "ENV URL=$API_HOST/v1\n",
            "environment/Dockerfile line 4: ENV URL uses $API_HOST, which the Dockerfile does not set",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "ENV FLYWHEEL_REPORT_DIR=/x\n",
            "environment/Dockerfile line 4: ENV FLYWHEEL_REPORT_DIR: the sandbox owns the FLYWHEEL_ variables",
        ),
        (
            "environment/requirements.txt",
            "--index-url https://example.org/simple\ngreetlib==1.0\n",
            "environment/Dockerfile line 4: requirements.txt line 1: pip option --index-url cannot be "
            "carried (environments install from the configured index)",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install --extra-index-url https://example.org/simple greetlib\n",
            "environment/Dockerfile line 4: pip option --extra-index-url cannot be carried",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install --frobnicate greetlib\n",
            "environment/Dockerfile line 4: pip install --frobnicate: an option flywheel does not know",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install 'greetlib==='\n",
            "environment/Dockerfile line 4: requirement 'greetlib===' cannot be parsed",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install -r missing.txt\n",
            "environment/Dockerfile line 4: pip reads missing.txt, which is not in environment/",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install -e .\n",
            "environment/Dockerfile line 4: pip installs the repository (.), whose pyproject.toml declares "
            "no static [project] dependencies",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install ./vendor/lib\n",
            "environment/Dockerfile line 4: pip installs ./vendor/lib, a local project other than the "
            "repository in WORKDIR /app",
        ),
        (
            "environment/Dockerfile",
            DOCKERFILE + "RUN pip install -e git+https://example.org/x.git\n",
            "environment/Dockerfile line 4: pip installs an editable git+https://example.org/x.git, "
            "which is not the repository",
        ),
        (
            "environment/compose.yaml",
            "services: {}\n",
            "needs its own Docker environment (environment/compose.yaml: several containers)",
        ),
        (
            "docker-compose.yaml",
            "services: {}\n",
            "needs its own Docker environment (docker-compose.yaml: several containers)",
        ),
        (
            "task.toml",
            '[[environment.mcp_servers]]\nname = "db"\ntransport = "sse"\nurl = "http://db:8000/sse"\n',
            "needs its own Docker environment (task.toml [[environment.mcp_servers]]: services beside the "
            "task's container)",
        ),
        (
            "task.toml",
            '[environment]\ndocker_image = "ghcr.io/acme/img:1"\n',
            "needs its own Docker environment (the prebuilt image ghcr.io/acme/img:1)",
        ),
        (
            "tests/test_outputs.py",
            "def test_out():\n    assert open('/tests/expected.txt').read()\n",
            "tests/test_outputs.py reads /tests, where Harbor uploads the tests: the grader lays them over "
            "WORKDIR /app instead",
        ),
    ],
)
def test_what_needs_a_container_is_refused_in_one_line(greet, tmp_path, rel, text, message):
    (greet / rel).write_text(text)
    with pytest.raises(FlywheelError) as e:
        import_tasks("harbor", greet, tmp_path / "ours", check_python=check_python)
    got = str(e.value)
    assert got.startswith("harbor task hello: ") and "\n" not in got, got
    assert message in got, got
    assert not (tmp_path / "ours").exists()


def test_a_repository_install_needs_static_dependencies_and_no_src_layout(greet, tmp_path):
    (greet / "environment" / "Dockerfile").write_text(DOCKERFILE + "RUN pip install -e '.[test]'\n")
    pyproject = greet / "environment" / "pyproject.toml"
    pyproject.write_text('[project]\nname = "hello"\ndynamic = ["dependencies"]\n')
    with pytest.raises(FlywheelError, match=r"declares no static \[project\] dependencies"):
        import_tasks("harbor", greet, tmp_path / "a")
    pyproject.write_text('[project]\nname = "hello"\ndependencies = ["greetlib==1.0"]\n')
    with pytest.raises(FlywheelError, match="pyproject.toml has no extra 'test'"):
        import_tasks("harbor", greet, tmp_path / "b")
    pyproject.write_text(
        '[project]\nname = "hello"\ndependencies = ["greetlib==1.0"]\n'
        '[project.optional-dependencies]\ntest = ["pytest-fortytwo==0.1"]\n'
    )
    (task,) = import_tasks("harbor", greet, tmp_path / "c")
    assert task.environment.requirements == ("greetlib==1.0", "pytest-fortytwo==0.1")
    write_files(greet / "environment", {"src/hello2/__init__.py": ""})
    with pytest.raises(FlywheelError, match="whose src/ layout only an install makes importable"):
        import_tasks("harbor", greet, tmp_path / "d")


def test_the_command_line_refuses_in_one_line_with_exit_2(greet, tmp_path):
    (greet / "environment" / "Dockerfile").write_text(DOCKERFILE + "ENV PATH=/opt/tools/bin:$PATH\n")
    out = tmp_path / "ours"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "flywheel",
            "tasks",
            "import",
            "--format",
            "harbor",
            str(greet),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("flywheel: error: harbor task hello: environment/Dockerfile line 4: ENV PATH")
    assert not out.exists()
