"""What the agent is told: the system prompt (tools, format, effort marker) and the task message."""

from __future__ import annotations

from flywheel.harness.effort import Effort
from flywheel.tasks.format import Task

TAGGED_HELP = """Act with exactly one action per turn:
<run_tests/>  run the tests
<view path="FILE" start="N" end="M"/>  show lines of a file
<shell>COMMAND</shell>  run a shell command
<edit path="FILE">
<old>
EXACT OLD TEXT
</old>
<new>
NEW TEXT
</new>
</edit>  replace text in a file
<submit/>  finish"""

NATIVE_HELP = "Use the tools to inspect the repository, fix it, run the tests, and call submit when done."


def system_prompt(effort: Effort, action_format: str) -> str:
    help_text = TAGGED_HELP if action_format == "tagged" else NATIVE_HELP
    return f"You are a software engineer fixing a bug in a Python repository.\n{effort.marker}\n{help_text}"


def task_message(task: Task, files: list[str]) -> str:
    listing = "\n".join(files[:40])
    return f"{task.instruction.strip()}\n\nFiles:\n{listing}"


SUMMARY_WORDS = 200
SUMMARY_PROMPT = (
    "Your context is nearly full. Summarise your working state so that you can go on from the summary "
    "alone: the task, what you have learned about the code, what you changed, what you tried that failed, "
    f"and what you will do next. Write at most {SUMMARY_WORDS} words of plain text, with no action."
)
RESUME_HEAD = "Your summary of the work so far:"


def resume_message(summary: str, observation: str) -> str:
    """The user message a conversation restarts from after a summary: the summary and the latest output."""
    text = f"{RESUME_HEAD} {summary.strip()}"
    return f"{text}\n\nThe output of your last action:\n{observation}" if observation else text
