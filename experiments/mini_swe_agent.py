"""mini-swe-agent, a real bash-only agent, against `flywheel serve`: steps, wall time and success per task.

`flywheel serve --model MODEL` runs as a subprocess on a free loopback port. For each of `--tasks`
toybugs held-out tasks (spread evenly over the split's sorted ids) and each configuration of
mini-swe-agent, the task's repository is copied to a fresh directory, mini-swe-agent's `DefaultAgent`
works in it (its `LocalEnvironment`: every command a new `bash` subshell there) until it echoes
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` or runs out of steps, and the project's grader (`flywheel.verify.default_grader`, the exploit detector reading the agent's
commands) grades the directory.

The two configurations are mini-swe-agent's own, unchanged but for where the model is:

- `text`: `mini_textbased.yaml` with `LitellmTextbasedModel`: the model answers with one fenced
  ```` ```mswea_bash_command ```` block;
- `tool`: `mini.yaml` with `LitellmModel`: the request offers one `bash` tool and the model calls it.

The model is litellm's `openai/MODEL` at the server's base URL. The scripted teachers read their task
from the request's `flywheel_meta` (litellm's `extra_body`), with `fence` naming the block the text
configuration parses; a served model with weights needs neither.

mini-swe-agent's `LocalEnvironment` runs commands on this machine, with no sandbox: `scripted-search` and
`scripted-sweep` are refused, because their commands use `/tmp` as a private scratch directory (`cp *.py
/tmp`, then `cp /tmp/*.py .`), which the project's sandbox gives them and this machine's `/tmp` is not.

    .venv/bin/python experiments/mini_swe_agent.py --tasks 5 --model scripted
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flywheel.protocols import Verdict
from flywheel.tasks import Task

# configuration -> (mini-swe-agent's config file, its model class)
CONFIGS = {"text": ("mini_textbased.yaml", "litellm_textbased"), "tool": ("mini.yaml", "litellm")}
FENCE = "mswea_bash_command"  # the block mini-swe-agent's text configuration parses
PRIVATE_TMP = ("scripted-search", "scripted-sweep")  # their commands need a private /tmp
ENV = {
    "MSWEA_SILENT_STARTUP": "1",  # no banner
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",  # a server error ends the run instead of 10 retries
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's price list from the package, not the network
}


@dataclass(frozen=True)
class Run:
    """One mini-swe-agent episode and its grade."""

    task_id: str
    config: str
    steps: int  # model calls
    wall_s: float  # the agent's run, grading excluded
    exit_status: str  # mini-swe-agent's: Submitted, LimitsExceeded, RepeatedFormatError, ...
    commands: tuple[str, ...]  # what it ran, in order
    verdict: Verdict


def configure(home: Path) -> None:
    """The environment mini-swe-agent reads (when imported, and per query): `ENV`, its config under `home`."""
    os.environ.update(ENV)
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(home))


@contextmanager
def served(model: str) -> Iterator[str]:
    """The base URL of `flywheel serve --model MODEL` on a free loopback port, stopped on exit."""
    argv = [sys.executable, "-m", "flywheel", "serve", "--model", model, "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""  # "serving MODEL at URL", or "" if it died
        if " at http://" not in line:
            raise RuntimeError(f"flywheel serve --model {model} did not start: {line!r}")
        yield line.split(" at ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def agent_for(url: str, model: str, task: Task, workspace: Path, config: str, step_limit: int):
    """mini-swe-agent's `DefaultAgent` in `config` (`CONFIGS`), on `workspace`, asking `model` at `url`."""
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True  # no "Provider List" line for a model it has no price for
    spec, model_class = CONFIGS[config]
    cfg = get_config_from_spec(spec)
    meta = {"task_dir": str(task.root), **({"fence": FENCE} if config == "text" else {})}
    kwargs = cfg["model"].get("model_kwargs", {}) | {
        "api_base": url,
        "api_key": "local",
        "extra_body": {"flywheel_meta": meta},
    }
    llm = get_model(
        f"openai/{model}",
        cfg["model"] | {"model_class": model_class, "cost_tracking": "ignore_errors", "model_kwargs": kwargs},
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # python with pytest
    env = LocalEnvironment(
        **cfg["environment"] | {"cwd": str(workspace), "env": cfg["environment"]["env"] | {"PATH": path}}
    )
    return DefaultAgent(llm, env, **cfg["agent"] | {"step_limit": step_limit, "cost_limit": 0})


def commands(messages: list[dict]) -> list[str]:
    """The bash commands an agent's messages ran, in order."""
    return [a["command"] for m in messages for a in m.get("extra", {}).get("actions", [])]


def run_task(url: str, model: str, task: Task, workspace: Path, config: str, step_limit: int = 30) -> Run:
    """Copy the task's repository to `workspace`, let mini-swe-agent work in it, grade it."""
    from flywheel.sandbox import get_sandbox
    from flywheel.verify import default_grader

    shutil.copytree(task.repo, workspace)
    agent = agent_for(url, model, task, workspace, config, step_limit)
    start = time.perf_counter()
    result = agent.run(task.instruction)
    wall_s = time.perf_counter() - start
    ran = commands(agent.messages)
    calls = [{"name": "bash", "arguments": {"command": c}} for c in ran]
    verdict = default_grader(get_sandbox())(task, workspace, {"turns": [{"tool_calls": calls}]})
    return Run(task.id, config, agent.n_calls, wall_s, str(result.get("exit_status")), tuple(ran), verdict)


def heldout_tasks(n: int) -> list[Task]:
    """`n` toybugs held-out tasks, spread evenly over the split's sorted ids (its modules differ)."""
    from flywheel.tasks import load_suite

    tasks = load_suite("toybugs", split="heldout")
    return [tasks[i * len(tasks) // n] for i in range(n)]


def table(runs: list[Run]) -> str:
    rows = [
        f"| {'task':<22} | config | steps | wall s | exit status | success |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        row = f"| {r.task_id:<22} | {r.config:<6} | {r.steps:>5} | {r.wall_s:>6.2f} | {r.exit_status:<11} |"
        rows.append(f"{row} {'yes' if r.verdict.success else 'no':<7} |")
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config]
        if mine:
            steps, wall = sum(r.steps for r in mine) / len(mine), sum(r.wall_s for r in mine) / len(mine)
            won = sum(r.verdict.success for r in mine)
            rows.append(
                f"| {'mean':<22} | {config:<6} | {steps:>5.1f} | {wall:>6.2f} | {'':<11} | {won}/{len(mine)} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="scripted", help="the model spec flywheel serve serves")
    ap.add_argument("--tasks", type=int, default=5, help="the first N toybugs held-out tasks")
    ap.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    ap.add_argument("--step-limit", type=int, default=30)
    args = ap.parse_args(argv)
    if args.model in PRIVATE_TMP:
        ap.error(f"{args.model}'s commands use /tmp as private scratch; mini-swe-agent runs them unsandboxed")
    with tempfile.TemporaryDirectory(prefix="flywheel-mini-") as tmp:
        root = Path(tmp)
        configure(root / "mswea")
        tasks = heldout_tasks(args.tasks)
        configs = list(CONFIGS) if args.config == "both" else [args.config]
        runs = []
        with served(args.model) as url:
            for config in configs:
                for task in tasks:
                    ws = root / "work" / config / task.id
                    runs.append(run_task(url, args.model, task, ws, config, args.step_limit))
        print(f"mini-swe-agent against flywheel serve --model {args.model}\n")
        print(table(runs))
    return 0 if all(r.verdict.success for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
