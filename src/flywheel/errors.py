"""User-facing errors.

`FlywheelError` is bad input from a user (a missing directory, a malformed task, an unknown suite): the CLI
prints its message as one line and exits with code 2. Anything else is a bug and keeps its traceback.
"""


class FlywheelError(Exception):
    """Bad input: the message is one clear line naming what is wrong (a file, a field, a value)."""


class TaskError(FlywheelError):
    """A task directory is missing files or has a malformed field."""


class PatchError(FlywheelError):
    """A unified diff is malformed or does not apply."""
