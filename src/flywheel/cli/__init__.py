"""The `flywheel` command line: thin wrappers over the packages, no logic of its own.

Each command group lives in its own module and is added to the app in `app`. Bad input raises
`FlywheelError` (or a click usage error); `main` prints it as one line and exits with code 2, never a
traceback.
"""

from flywheel.cli.app import app, fail, main

__all__ = ["app", "fail", "main"]
