"""The imitation base (our "K3"): teachers' episodes, renaming, and supervised fine-tuning on them.

- `imitate`: `flywheel sft CONFIG` — collect a teacher's episodes through the real harness (`collect`),
  augment them, and train a tiny transformer (or the top layers of a pretrained one) to imitate the
  actions (`run_sft`, configured by `SftConfig`); `trained_harness` gives the harness settings a base
  learned under, so that it is evaluated under the same ones.
- `rename`: the same episode, or the same task, with its own names made up anew (`rename_messages`,
  `rename_task`) or its module's lines moved (`shift_lines`), so that a base copies from its context
  instead of recalling the train modules.

The RL loop (`flywheel.rl`) starts from the base this package writes.
"""

from flywheel.sft.imitate import DATA_FORMAT, SftConfig, collect, run_sft, trained_harness
from flywheel.sft.rename import rename_messages, rename_task, shift_lines

__all__ = [
    "DATA_FORMAT",
    "SftConfig",
    "collect",
    "rename_messages",
    "rename_task",
    "run_sft",
    "shift_lines",
    "trained_harness",
]
