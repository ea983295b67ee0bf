"""A small real trainer for the loop tests, a fast grader, and a script entry for the trainer-kill test.

`FakeTrainer` implements the loop's trainer contract with real code paths: it replays each assistant
turn's sampling distribution on a tiny HF model (`replay_log_probs`), takes the truncated-importance-
weighted policy loss (`policy_loss`) and an AdamW step. Its advantages carry a little noise from its own
generator, so resuming without restoring the RNG would show in the metrics.

`quick_grade` checks the workspace against the task's fixed source instead of running pytest in the
sandbox, so an episode costs milliseconds, not seconds (the loop, not the grader, is under test here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from flywheel.protocols import Verdict
from flywheel.record import Trajectory

WORDS = [
    "def f(x):\n    return x * 2\n",
    '<edit path="mathx.py"><old>x</old><new>y</new></edit>',
    "<submit/>",
]


class FakeTrainer:
    """Tiny-model RL trainer with the `LoopTrainer` contract."""

    def __init__(
        self, model_dir: str | Path, lr: float = 3e-3, seed: int = 0, temperature: float = 1.0
    ) -> None:
        from flywheel.models.hf import load_hf

        torch.set_num_threads(1)
        self.model, _ = load_hf(model_dir)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(seed)
        self.temperature = temperature
        self.version = 0

    def step(self, records: list[Trajectory]) -> tuple[dict[str, float], list[dict[str, float]]]:
        from flywheel.rl import policy_loss, replay_log_probs

        rewards = torch.tensor([float(r.success) - 1e-3 * r.completion_tokens for r in records])
        adv = rewards - rewards.mean() + 1e-2 * torch.randn(len(records), generator=self.gen)
        self.opt.zero_grad(set_to_none=True)
        total, tokens, is_w = 0.0, 0, []
        for record, a in zip(records, adv.tolist(), strict=True):
            for turn in record.turns:
                if turn["role"] != "assistant" or not turn.get("token_ids"):
                    continue
                prompt, ids = turn["prompt_ids"], turn["token_ids"]
                logits = self.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
                lp = replay_log_probs(logits, turn["kept"], torch.tensor(ids), self.temperature)
                mask = torch.ones_like(lp, dtype=torch.bool)
                loss, stats = policy_loss(
                    lp, torch.tensor(turn["logprobs"]), torch.tensor([a]), mask, token_budget=256.0
                )
                loss.backward()
                total, tokens = total + loss.item(), tokens + len(ids)
                is_w.append(stats["is_weight_mean"])
        self.opt.step()
        self.version += 1
        metrics = {
            "loss": total,
            "reward_mean": float(rewards.mean()),
            "adv_abs_mean": float(adv.abs().mean()),
            "tokens": float(tokens),
            "is_weight_mean": sum(is_w) / max(1, len(is_w)),
        }
        return metrics, [
            {"reward": float(r), "advantage": float(a)} for r, a in zip(rewards, adv, strict=True)
        ]

    def serving_weights(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().to(torch.bfloat16).clone() for n, t in self.model.state_dict().items()}

    def save(self, dir: Path) -> None:
        dir.mkdir(parents=True)
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "rng": self.gen.get_state()}
        torch.save({**state, "version": self.version}, dir / "state.pt")

    def load(self, dir: Path) -> None:
        state = torch.load(dir / "state.pt", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["rng"])
        self.version = int(state["version"])


def quick_grade(task: Any, workspace: Path, trajectory: dict) -> Verdict:
    """Success when every file the reference patch touches now matches the fixed source."""
    ok = (workspace / "mathx.py").is_file() and "if x > hi:" in (workspace / "mathx.py").read_text()
    return Verdict(task_id=task.id, success=ok)


def trainer_keys(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl lines without the loop's timing and counter keys (what the trainer computed)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("loop_")} for r in rows]


def loop_config(model_dir: Path, **kw: Any):
    from flywheel.harness import get_effort
    from flywheel.loop import LoopConfig

    base = dict(
        model=f"hf:{model_dir}", backend="local", pools=2, pool_batch=2, groups_per_step=1, samples=2, steps=3,
        efforts={"medium": get_effort("medium", max_turns=2, turn_tokens=12)}, grader=quick_grade,
        anchor_every=3, catch_up_wait_s=20.0,
    )  # fmt: skip
    base.update(kw)
    return LoopConfig(**base)


def main(argv: list[str]) -> None:
    """`python loop_helpers.py MODEL_DIR TASK_DIR OUT_DIR STEPS`: a deterministic run (the kill test)."""
    from flywheel.loop import run
    from flywheel.tasks import load_task

    model_dir, task_dir, out_dir, steps = Path(argv[0]), Path(argv[1]), Path(argv[2]), int(argv[3])
    cfg = loop_config(model_dir, steps=steps, deterministic=True)
    run(cfg, FakeTrainer(model_dir), [load_task(task_dir)], out_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
