"""The `flywheel` application: the command groups added to one Typer app, and `main`, which turns bad
input into one line and exit code 2."""

from __future__ import annotations

import typer

try:  # typer ships its own copy of click from 0.29 on; its exceptions are the ones raised
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses the click package
    from click import exceptions as click_exceptions

from flywheel.errors import FlywheelError

app = typer.Typer(
    name="flywheel",
    help="Flywheel: train coding agents with reinforcement learning, from tasks to weight deltas.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    # The command modules import their packages inside each command, so `flywheel --help` stays fast.
    from flywheel.cli import delta, export, grade, report, review, sandbox, serve, solve, tasks, train
    from flywheel.cli import eval as eval_cli

    app.add_typer(tasks.app, name="tasks")
    app.add_typer(sandbox.app, name="sandbox")
    app.command("grade")(grade.grade)
    app.command("eval")(eval_cli.eval_)
    app.add_typer(delta.app, name="delta")
    app.command("serve")(serve.serve)
    app.command("sft")(train.sft)
    app.command("calibrate")(train.calibrate)
    app.command("train")(train.train)
    app.command("export")(export.export)
    app.command("report")(report.report)
    app.command("solve")(solve.solve)
    app.command("review")(review.review)


def fail(message: str) -> None:
    """Print one error line and exit 2."""
    typer.echo(f"flywheel: error: {message}", err=True)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    _register()
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="flywheel", standalone_mode=False)
    except FlywheelError as e:
        fail(str(e))
    except click_exceptions.NoArgsIsHelpError as e:
        typer.echo(e.ctx.get_help() if e.ctx else "", err=True)
        raise SystemExit(2) from None
    except click_exceptions.UsageError as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        fail(f"{e.format_message()}{hint}")
    except typer.Abort:
        typer.echo("aborted", err=True)
        raise SystemExit(130) from None
    except click_exceptions.ClickException as e:
        fail(e.format_message())
    raise SystemExit(rc if isinstance(rc, int) else 0)
