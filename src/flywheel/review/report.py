"""A review as markdown (for people, on stdout) and as JSON (`Review.to_json`, for machines)."""

from __future__ import annotations

from flywheel.review.agent import CHANGES
from flywheel.review.run import Review

LISTED = 20  # tests listed per kind


def markdown(r: Review) -> str:
    """The review: decision and reasons, tests before and after, the checks' findings, the reviewer's
    verdict and comments."""
    title = "Changes requested" if r.decision == CHANGES else "Approved"
    lines = [f"# Review: {title}", "", f"Change: {r.source}; files: {', '.join(r.files) or 'none'}"]
    if r.instruction:
        lines.append(f"Meant to: {r.instruction.strip()}")
    if r.reasons:
        lines += ["", "Why:", *(f"- {reason}" for reason in r.reasons)]
    lines += ["", "## Tests", "", f"Command: `{r.after.command}`"]
    for when, run in (("before", r.before), ("after", r.after)):
        result = "passed" if run.passed else "failed"
        lines.append(f"- {when} the change: {result}" + (f" ({run.error})" if run.error else ""))
    d = r.delta
    for label, items in (
        ("fixed (failing before, passing after)", d.fixed),
        ("broken (passing before, not after)", d.broken),
        ("still failing", d.still_failing),
        ("skipped now (failing before)", d.skipped),
        ("added", d.added),
        ("removed", d.removed),
    ):
        if items:
            more = f" and {len(items) - LISTED} more" if len(items) > LISTED else ""
            lines.append(f"- {label}: " + ", ".join(f"`{t}`" for t in items[:LISTED]) + more)
    lines += ["", "## Checks", ""]
    lines += [
        f"- {'**' + f.kind + '**' if f.blocking else f.kind} `{f.where()}`: {f.message}" for f in r.findings
    ] or ["- nothing found"]
    lines += ["", "## Reviewer", "", *_reviewer(r)]
    return "\n".join(lines) + "\n"


def _reviewer(r: Review) -> list[str]:
    v = r.reviewer
    if v is None:
        return ["No model reviewed the change (--model): the tests and the checks decided."]
    head = f"{v.model}" + (" (scripted, for tests and demos: not a review)" if v.scripted else "")
    lines = [
        f"{head}: {v.decision or 'no verdict'}; ending {v.ending} after {v.turns} turns, "
        f"{v.prompt_tokens} + {v.completion_tokens} tokens, cost ${v.cost:.6f}"
    ]
    lines += [f"- `{c.path}:{c.line}`: {c.text}" for c in v.comments]
    return lines
