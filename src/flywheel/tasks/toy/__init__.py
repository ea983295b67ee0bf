"""The built-in `toybugs` suites: one planted bug per task in small, realistic Python modules.

Modules: `suite` (the `toybugs` suite: the shipped modules, mutation, selection, the task directories),
`evaluate` (running a candidate bug against a module's tests in a worker process), `long` (`toybugs-long`:
the same bugs in modules and test runs longer than a 2,048-token context).
"""

from flywheel.tasks.toy.suite import (
    BUILTIN,
    HELDOUT_MODULES,
    PER_MODULE,
    TEST_COMMAND,
    VERSION,
    build,
    module_names,
    read_module,
    test_names,
)

__all__ = [
    "BUILTIN",
    "HELDOUT_MODULES",
    "PER_MODULE",
    "TEST_COMMAND",
    "VERSION",
    "build",
    "module_names",
    "read_module",
    "test_names",
]
