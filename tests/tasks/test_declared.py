"""What a repository declares it needs: pyproject.toml, requirements files and setup.cfg, read from small
repositories written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.errors import TaskError
from flywheel.tasks.declared import declared_requirements, read_requirements, requirement_files


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


PYPROJECT = """
[project]
name = "My_Pkg"
dependencies = ["requests>=2", "attrs ; python_version >= '3.8'"]

[project.optional-dependencies]
test = ["pytest-fortytwo", "my-pkg[extra]"]
extra = ["rich"]
docs = ["sphinx"]
dev = ["requests>=2", "black"]

[dependency-groups]
lint = ["ruff"]
tests = ["hypothesis", {include-group = "lint"}]
"""


def test_pyproject_dependencies_test_extras_and_groups(tmp_path):
    repo = write(tmp_path, {"pyproject.toml": PYPROJECT})
    assert declared_requirements(repo) == [
        "requests>=2",
        "attrs ; python_version >= '3.8'",
        "pytest-fortytwo",
        "rich",  # my-pkg[extra]: the project itself, with an extra that brings rich
        "black",
        "hypothesis",
        "ruff",
    ]


def test_requirements_files_are_read_as_pip_reads_them(tmp_path):
    repo = write(
        tmp_path,
        {
            "requirements.txt": "# runtime\n\nnumpy==1.26 ; python_version < '3.13'  # pinned\n-r base.txt\n"
            "--index-url https://example.invalid/simple\n-e .\n.[test]\n",
            "base.txt": "six\\\n>=1.16\n-c constraints.txt\n",
            "requirements-dev.txt": "-r requirements.txt\npytest-cov --hash=sha256:abc\n",
            "requirements-docs.txt": "sphinx\n",
            "requirements/test.txt": "-r ../requirements-dev.txt\ngreetlib==1.0\n",
            "requirements/doc.txt": "furo\n",
        },
    )
    assert [p.name for p in requirement_files(repo)] == [
        "requirements.txt",
        "requirements-dev.txt",
        "test.txt",
    ]
    assert declared_requirements(repo) == [
        "numpy==1.26 ; python_version < '3.13'",
        "six>=1.16",
        "pytest-cov",
        "greetlib==1.0",
    ]


def test_setup_cfg_install_requires_and_test_extras(tmp_path):
    repo = write(
        tmp_path,
        {
            "setup.cfg": "[metadata]\nname = calc\n\n[options]\ninstall_requires =\n    click>=8\n"
            "    colorama; sys_platform == 'win32'\n\n[options.extras_require]\ntesting =\n    calc[fast]\n"
            "    pytest-mock\nfast = ujson\ndocs = sphinx\n",
        },
    )
    assert declared_requirements(repo) == [
        "click>=8",
        "colorama; sys_platform == 'win32'",
        "ujson",
        "pytest-mock",
    ]


def test_sources_come_in_order_and_duplicates_go(tmp_path):
    repo = write(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "calc"\ndependencies = ["greetlib==1.0", "calc"]\n',
            "requirements.txt": "greetlib == 1.0\ncalc>=0.1\npytest\n",
            "setup.cfg": "[options]\ninstall_requires = file: requirements.txt\n",
        },
    )
    assert declared_requirements(repo) == ["greetlib==1.0", "pytest"]


def test_a_repository_that_declares_nothing(tmp_path):
    assert declared_requirements(write(tmp_path, {"calc.py": "x = 1\n"})) == []


@pytest.mark.parametrize(
    "files,fragment",
    [
        ({"requirements.txt": "ok\nfoo==\n"}, "requirements.txt line 2: requirement 'foo=='"),
        (
            {"requirements/dev.txt": "-r ../../outside.txt\n"},
            "requirements/dev.txt line 1: -r ../../outside.txt lies outside",
        ),
        ({"requirements.txt": "-r missing.txt\n"}, "requirements.txt line 1: -r missing.txt: no such file"),
        ({"pyproject.toml": "[project\n"}, "pyproject.toml: not valid TOML"),
        (
            {"pyproject.toml": '[project]\ndependencies = "x"\n'},
            "pyproject.toml [project] dependencies: must be a list",
        ),
        (
            {"pyproject.toml": '[project.optional-dependencies]\ntest = ["a b c"]\n'},
            "pyproject.toml [project.optional-dependencies] test: requirement 'a b c'",
        ),
        ({"pyproject.toml": '[dependency-groups]\ndev = [{include-group = "nope"}]\n'}, "no group 'nope'"),
        (
            {"setup.cfg": "[options]\ninstall_requires =\n    ok\n    ==2\n"},
            "setup.cfg [options] install_requires",
        ),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_file(tmp_path, files, fragment):
    repo = write(tmp_path / "repo", files)
    with pytest.raises(TaskError) as e:
        declared_requirements(repo)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_requirements_file_given_by_hand_may_include_any_file(tmp_path):
    write(tmp_path, {"common.txt": "greetlib==2.0\n", "env/reqs.txt": "-r ../common.txt\npytest\n"})
    assert read_requirements(tmp_path / "env" / "reqs.txt") == ["greetlib==2.0", "pytest"]
    with pytest.raises(TaskError, match="lies outside"):
        read_requirements(tmp_path / "env" / "reqs.txt", root=tmp_path / "env")
    (tmp_path / "loop.txt").write_text("-r loop.txt\nsix\n")
    assert read_requirements(tmp_path / "loop.txt") == ["six"]
