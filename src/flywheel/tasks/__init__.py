"""Repository tasks: the directory format, built-in suites, and suite resolution.

A suite is either a built-in name (`toybugs`, `toybugs-long`, `humaneval`) or a directory of task
directories. Built-in suites are generated deterministically and materialised once under the cache
directory (`$FLYWHEEL_CACHE`, else `$XDG_CACHE_HOME/flywheel`, else `~/.cache/flywheel`); later calls
reuse them.

The rooms:

- `format`: the task directory (`Task`), its validating loader and its atomic writer.
- `suites`: the built-in suites by name (`SUITES`, resolved lazily by `flywheel.registry`), their cache,
  and `load_suite`.
- `toy`, `toy.long`, `humaneval`: the built-in suites' generators.
- `mutate`, `patch`: planting a bug in a function's AST; unified diffs made and applied as pure functions.
- `synth`: bug synthesis in a real project with its own pytest suite.
- `declared`: what a repository declares it needs to run its tests (its environment's requirements).
- `curate`: keeping the tasks a policy solves only sometimes.
- `interop`: Harbor task directories and SWE-bench instances, in and out.
"""

from flywheel.tasks.format import Task, load_task, task_toml, write_task
from flywheel.tasks.suites import builtin_suites, cache_dir, load_suite

__all__ = ["Task", "load_task", "task_toml", "write_task", "load_suite", "builtin_suites", "cache_dir"]
