"""Reinforcement learning for the flywheel: the trainer's objective, the optimizers and λ calibration.

- `objective`: top-p sampling-distribution replay and the truncated-importance-sampling policy loss (the
  reward, baselines and advantages it trains on are `flywheel.rubric`'s);
- `optim`: Muon for hidden matrices + AdamW for embeddings, head, norms and biases, as one optimizer;
- `calibrate`: each effort level's λ from the base model's cost/success frontier (matplotlib is imported
  only when plotting), and `run_calibration` (`flywheel calibrate`), which measures the base first;
- `config`: the run config's sections; `train` and `trainer`: the training loop built on top.

Running episodes is `flywheel.eval.run`; the imitation base is `flywheel.sft`.
"""

from flywheel.rl.calibrate import Calibration, calibrate, frontier, local_slope, plot_calibration
from flywheel.rl.objective import importance_weights, kept_mask, policy_loss, replay_entropy, replay_log_probs
from flywheel.rl.optim import CompositeOptimizer, build_optimizer, split_parameters

__all__ = [
    "Calibration",
    "CompositeOptimizer",
    "build_optimizer",
    "calibrate",
    "frontier",
    "importance_weights",
    "kept_mask",
    "local_slope",
    "plot_calibration",
    "policy_loss",
    "replay_entropy",
    "replay_log_probs",
    "split_parameters",
]
