"""The seams of the flywheel, in one place.

Every component is a backend of one of these protocols, and the code programs against them: the sandbox
an attempt runs in, the model that acts, the grader that judges, the trainer that updates weights, the
loop backend that places trainer and pools, and the store that carries weights. Value
types exchanged across a seam live here too, so that a reader sees every contract on one page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# ----------------------------------------------------------------------------------------------- sandbox


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed command."""

    timeout_s: float = 60.0  # wall-clock limit; the command is killed and exit code 124 returned
    memory_mb: int = 2048  # address space / cgroup memory limit
    max_procs: int = 64  # processes and threads alive at once
    max_file_mb: int = 64  # largest file the command may write
    disk_mb: int = 512  # the workspace's (and read-write mounts') total size on disk; the run fails past it
    output_bytes: int = 16_384  # captured output kept (head and tail); the rest is marked as truncated


@dataclass(frozen=True)
class RunResult:
    """What a sandboxed command did."""

    exit_code: int  # the command's exit code; 124 on timeout; 128+N when killed by signal N
    output: str  # stdout and stderr interleaved, truncated to Limits.output_bytes
    timed_out: bool = False
    truncated: bool = False
    wall_s: float = 0.0


WORKSPACE = "/workspace"  # where the workspace appears in the sandbox unless an environment moves it


@dataclass(frozen=True)
class Environment:
    """What a task's repository needs around it in the sandbox (task.toml's `[environment]`).

    `requirements` and `python` name a built environment (a virtual environment made once per distinct
    pair, cached, mounted read-only with its `bin` first on PATH: `flywheel.sandbox.envs`); `env` is laid
    over every command's environment; `workdir` is where the workspace appears (the working directory).
    The default, `Environment()`, is the project's own Python at /workspace, as before environments.
    """

    requirements: tuple[str, ...] = ()  # pip requirement strings
    python: str | None = None  # "3.12": an interpreter of that version on this host; None: the project's
    env: tuple[tuple[str, str], ...] = ()  # (name, value) pairs, sorted by name
    workdir: str = WORKSPACE

    @property
    def built(self) -> bool:
        """Whether a virtual environment has to be built for it (else the project's Python serves)."""
        return bool(self.requirements) or self.python is not None


@runtime_checkable
class Sandbox(Protocol):
    """Runs commands in an isolated workspace: no network, read-only host, bounded resources."""

    name: str

    def run(
        self,
        workspace: Path,
        argv: Sequence[str],
        *,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        extra_ro: Mapping[Path, Path] | None = None,
        extra_rw: Mapping[Path, Path] | None = None,
        environment: Environment | None = None,
    ) -> RunResult:
        """Run `argv` with `workspace` mounted read-write at the sandbox's working directory.

        `extra_ro` / `extra_rw` map host paths to paths inside the sandbox (the grader mounts its report
        directory this way). `environment`: the task's (its built environment, variables and workdir).
        Returns when every process the command started is gone.
        """
        ...


# ------------------------------------------------------------------------------------------------ models


@dataclass
class Request:
    """One generation request: a conversation so far and how to sample the next message."""

    messages: list[dict[str, Any]]  # OpenAI-style {"role", "content"} (+ "tool_calls" / "tool_call_id")
    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None  # OpenAI function-tool schema, for native tool calling
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # episode context (task dir, ids) for oracles/logs
    # called with each token id as it is sampled, by models that generate token by token (the torch engine),
    # from their generating thread; others never call it (`flywheel serve` streams with it)
    on_token: Callable[[int], None] | None = field(default=None, repr=False, compare=False)


@dataclass
class Completion:
    """One generated message, with what the trainer needs to replay its sampling distribution."""

    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "context" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # native calls: {"name", "arguments"}
    prompt_ids: list[int] | None = None  # in-process engines: the exact prompt token ids
    token_ids: list[int] | None = None  # in-process engines: the sampled token ids
    logprobs: list[float] | None = None  # log-prob of each sampled token under the sampling distribution
    kept: list[list[int]] | None = None  # top-p kept set at each position (None entry: full vocabulary)
    error: str | None = None
    policy_version: int | None = None  # the weights' version a server reports generating it with


@runtime_checkable
class Model(Protocol):
    """A policy: turns conversations into next messages, many episodes per call."""

    name: str

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Generate one completion per request. Failures come back as Completion(error=...), not raised."""
        ...


# --------------------------------------------------------------------------------------------- verifier


@dataclass
class Verdict:
    """The grader's decision on one finished workspace (the JSON printed by `flywheel grade`)."""

    task_id: str
    success: bool  # the hidden tests pass and no exploit signature fired: a cheat is never a success
    cheat: bool = False  # an exploit signature fired (`flywheel.verify.exploits`)
    signatures: list[str] = field(default_factory=list)
    fail_to_pass: tuple[int, int] = (0, 0)  # (passed, total)
    pass_to_pass: tuple[int, int] = (0, 0)
    error: str | None = None
    tests: dict[str, str] = field(default_factory=dict)  # test id -> outcome as the grader read it
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "success": self.success,
            "cheat": self.cheat,
            "signatures": list(self.signatures),
            "fail_to_pass": {"passed": self.fail_to_pass[0], "total": self.fail_to_pass[1]},
            "pass_to_pass": {"passed": self.pass_to_pass[0], "total": self.pass_to_pass[1]},
            "error": self.error,
            "tests": dict(self.tests),
            "wall_s": round(self.wall_s, 4),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict `to_json` wrote; missing keys take their defaults. The legacy key `reward` (a copy
        of `success` that verdicts no longer carry) is dropped; any other unknown key is a ValueError."""
        unknown = set(data) - {f.name for f in fields(cls)} - {"reward"}
        if unknown:
            raise ValueError(f"verdict: unknown key '{sorted(unknown)[0]}'")
        return cls(
            task_id=str(data.get("task_id", "")),
            success=bool(data.get("success", False)),
            cheat=bool(data.get("cheat", False)),
            signatures=list(data.get("signatures") or []),
            fail_to_pass=_pair(data.get("fail_to_pass")),
            pass_to_pass=_pair(data.get("pass_to_pass")),
            error=data.get("error"),
            tests=dict(data.get("tests") or {}),
            wall_s=float(data.get("wall_s", 0.0)),
        )


def _pair(counts: Mapping[str, int] | None) -> tuple[int, int]:
    """(passed, total) from `{"passed", "total"}`; (0, 0) when absent."""
    return (int(counts["passed"]), int(counts["total"])) if counts else (0, 0)


@runtime_checkable
class Grader(Protocol):
    """Grades a finished workspace against its task, never in place (`flywheel.verify.default_grader`)."""

    def __call__(self, task: Any, workspace: Path, trajectory: dict[str, Any]) -> Verdict:
        """`trajectory` holds the attempt's actions (`{"turns": [...]}`) for the exploit detectors."""
        ...


# ------------------------------------------------------------------------------------ trainer and loop


@runtime_checkable
class LoopTrainer(Protocol):
    """Turns graded trajectory records into new weights (`flywheel.rl.trainer.Trainer`, or a test's fake)."""

    version: int  # the version of the current weights; `step` increments it

    def step(self, records: list[Any]) -> tuple[dict[str, float], list[dict[str, float]]]:
        """One update from graded records (`flywheel.record.Trajectory`, which sits beside this module and
        imports it, so it is not named in the signature); returns the step's metrics and each record's
        score (its reward, advantage and what they were computed from), in the records' order."""
        ...

    def serving_weights(self) -> dict[str, Any]:
        """bf16 copies of the weights to publish (names as in the pools' model state dict)."""
        ...

    def save(self, dir: Path) -> None:
        """Write a complete checkpoint (model, optimizer, RNG, version) into `dir` (not yet existing)."""
        ...

    def load(self, dir: Path) -> None:
        """Restore what `save` wrote."""
        ...


class LoopBackend(Protocol):
    """Where the loop's trainer host and pools run (`flywheel.loop`: inline, local processes, Ray actors).

    Trainer calls are asynchronous handles; pool traffic is events `(kind, pool_id, payload)` with kind
    one of ready, started, record, batch, lost, error.
    """

    def call(self, method: str, *args: Any) -> Any:
        """Start `TrainerHost.<method>(*args)`; returns a handle for `done` and `result`."""
        ...

    def done(self, handle: Any) -> bool: ...

    def result(self, handle: Any) -> Any: ...

    def start_pool(self, spec: Any) -> None:
        """Start (or restart) a pool; it reports "ready" once it serves weights."""
        ...

    def submit(self, pool_id: str, items: list[Any]) -> None: ...

    def poll(self, timeout: float) -> list[tuple[str, str, Any]]:
        """The events that arrived within `timeout` seconds."""
        ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------------ weights


class WeightStore(Protocol):
    """Object storage for weight versions: full anchors and deltas, published atomically."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None:
        """Remove `key`; a key that is not there is not an error."""
        ...
