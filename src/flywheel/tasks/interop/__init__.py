"""Other systems' task formats, in and out: Harbor task directories and SWE-bench instances.

`import_tasks(fmt, src, out)` reads tasks another system wrote and writes them as a suite of our task
directories; `export_tasks(fmt, tasks, out)` writes our tasks in the other format. Either builds its whole
output in a temporary sibling of `out` and renames it into place at the end, so `out` is absent or complete,
never half-written. Input we cannot carry is refused with one `FlywheelError` naming the task (or instance)
and what is missing.

What maps to what:

| ours | Harbor | SWE-bench |
| --- | --- | --- |
| `id` | the task directory's name | `instance_id` |
| `instruction` | `instruction.md` | `problem_statement` |
| `repo/` | `environment/`: what the Dockerfile COPYs into WORKDIR | `DIR/OWNER__NAME` at `base_commit` |
| `tests/` (hidden) | `tests/` but `test.sh` (laid over WORKDIR) | the files `test_patch` adds or changes |
| `solution.patch` | `solution/solve.sh`: a diff it feeds to `patch` or `git apply` | `patch` |
| `fail_to_pass` | the tests `test.sh` runs with pytest, all of them | `FAIL_TO_PASS` (pytest node ids) |
| `pass_to_pass` | none | `PASS_TO_PASS` |
| `timeout_s` | `[verifier] timeout_sec` | 600 s |
| `[environment]` | the Dockerfile: `FROM python:3.X` (python), `WORKDIR` (workdir), `ENV` (env), `RUN pip install` (requirements) | `/testbed`, `--environment FILE` or what the repository declares |

An export also carries every field of ours (`[metadata.flywheel]` in Harbor's task.toml, an extra
`flywheel` field in each SWE-bench instance: test_command, timeout_s, meta, the split of the tests, and for
SWE-bench the hidden files `test_patch` leaves unchanged), so ours → Harbor → ours and ours → SWE-bench →
ours give the same task back. An imported SWE-bench instance keeps `FAIL_TO_PASS`/`PASS_TO_PASS` (as lists)
and its other plain fields in `meta`; a Harbor task keeps its `[metadata]` scalars. A SWE-bench instance's
environment is its repository at `/testbed` with the requirements of `--environment FILE`, else what the
repository declares (`flywheel.tasks.declared`); an exported task's environment travels in its `flywheel`
field.

What is not covered:
- a Harbor task that needs its own container: system packages (`apt-get`, `apt`, `apk`, `yum`, `dnf`),
  a base image other than python or a bare OS (ubuntu, debian, alpine: the tests then run on our Python),
  a multi-stage build or COPY from another stage, any RUN but `pip install` (and `mkdir`, `cd`), a pip
  option that changes where packages come from (`--index-url`, `--find-links`, constraints), an ENV PATH
  beyond directories under WORKDIR or /usr/local/bin, a WORKDIR the sandbox cannot give (under /usr,
  /tmp, ...: `check_workdir`), a python image whose version this host lacks (when the caller passes
  `check_python`), compose files and `[[environment.mcp_servers]]` (services), a prebuilt image; tests
  that read `/tests/…` (the hidden tests are laid over WORKDIR, not uploaded there); a test.sh that runs
  anything but one pytest run and its bookkeeping (installing pytest, writing the reward). We run no
  Docker, so these are refused (`flywheel.tasks.interop.dockerfile` lists what a Dockerfile may do).
- Packages a test.sh installs for itself (`pip install`, `uvx -w`) are not carried: only the
  Dockerfile's become requirements, so a hidden test that imports one fails `flywheel tasks validate`.
- `pip install .` of the repository gives only its pyproject.toml's static `[project]` dependencies (and
  the extras it names); the repository is not installed, so a `src/` layout is refused.
- Harbor has no fail/pass split: every test test.sh runs is fail_to_pass, and `flywheel tasks validate`
  reports those that already pass before the fix. A parametrized test is refused unless test.sh names it
  by node id, since only pytest knows its ids.
- A solve.sh that edits files other than through a diff (`cat > file`, `sed -i`, a script) gives no
  reference patch; the task is refused.
- SWE-bench instances whose tests are not pytest node ids (Django's and sympy's runners) are refused.
  An exported `base_commit` is synthetic: the SHA-1 of the repository's files, not a git commit; the
  repository lies beside `instances.jsonl` as a plain copy, one per task (`repos/flywheel__<id>`).
- An exported task's environment is also written the way Harbor builds it (`FROM python:3.X-slim` when it
  names a Python, `RUN pip install` of its requirements, `ENV`, `WORKDIR` at its workdir, or /app when it
  keeps the default /workspace); reading ours back takes it from `[metadata.flywheel.environment]`.
- An exported Harbor test.sh is graded by pytest's exit status: a skipped test passes there (our grader
  counts it failed), and the grader's exploit checks do not travel.

The modules:
- `convert`: the entry points `import_tasks` and `export_tasks`, and the staging of their output.
- `draft`: a task read from another system before it is written (`Draft`), its checks, and the readers
  of the source's files and fields both formats share.
- `harbor`: Harbor task directories, read and written.
- `dockerfile`: a Harbor task's Dockerfile, read without Docker (what it copies where and the
  environment it sets up, or a refusal).
- `scripts`: Harbor's shell scripts, read without running them (test.sh's pytest run, solve.sh's diff).
- `swebench`: SWE-bench instances, read and written.
"""

from flywheel.tasks.interop.convert import FORMATS, check_format, export_tasks, import_tasks
from flywheel.tasks.interop.dockerfile import docker_plan
from flywheel.tasks.interop.draft import tree_digest
from flywheel.tasks.interop.scripts import collect_test_ids, pytest_targets, solve_patch

__all__ = [
    "FORMATS",
    "check_format",
    "import_tasks",
    "export_tasks",
    "tree_digest",
    "collect_test_ids",
    "docker_plan",
    "pytest_targets",
    "solve_patch",
]
