"""Reinforcement learning for the flywheel: the objective, the optimizers and λ calibration.

- `objective`: reward ``R = S - λ_e·C`` and the alternating length penalty, group baselines
  (length-weighted by default), advantages, top-p sampling-distribution replay and the
  truncated-importance-sampling policy loss;
- `optim`: Muon for hidden matrices + AdamW for embeddings, head, norms and biases, as one optimizer;
- `calibrate`: each effort level's λ from the base model's cost/success frontier (matplotlib is imported
  only when plotting), and `run_calibration` (`flywheel calibrate`), which measures the base first;
- `rollout`: the cost the reward sees (`reward_cost`).

These are pure functions of numbers or tensors, but for `run_calibration`; the training loop (`train`,
`trainer`) is built on top. Running episodes is `flywheel.eval.run`; the imitation base is `flywheel.sft`.
"""

from flywheel.rl.calibrate import Calibration, calibrate, frontier, local_slope, plot_calibration
from flywheel.rl.objective import (
    advantages,
    advantages_flat,
    group_mean_baseline,
    importance_weights,
    kept_mask,
    length_penalty_on,
    length_weighted_baseline,
    over_budget,
    policy_loss,
    replay_entropy,
    replay_log_probs,
    reward,
)
from flywheel.rl.optim import CompositeOptimizer, build_optimizer, split_parameters

__all__ = [
    "Calibration",
    "CompositeOptimizer",
    "advantages",
    "advantages_flat",
    "build_optimizer",
    "calibrate",
    "frontier",
    "group_mean_baseline",
    "importance_weights",
    "kept_mask",
    "length_penalty_on",
    "length_weighted_baseline",
    "local_slope",
    "over_budget",
    "plot_calibration",
    "policy_loss",
    "replay_entropy",
    "replay_log_probs",
    "reward",
    "split_parameters",
]
