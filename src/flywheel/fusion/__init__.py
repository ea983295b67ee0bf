"""Fusion: a lead agent and a less expensive sidekick, each with its own model and its own context.

The lead (often a frontier model) interprets the task, plans and reviews; the sidekick (often the
RL-trained model) explores, implements and tests what the lead hands it. The lead is an ordinary harness
episode with one tool more, `delegate` (`flywheel.actions.DELEGATE`, offered through the harness's
`ExtraTools` hook; a plain agent never sees it). A delegation runs one whole sidekick episode under the
harness in the lead's own workspace (`EpisodeSpec.workspace`): its own tools, budgets, effort level and
conversation, which starts from the task and the lead's instruction. Its report is the tool's output
(`sidekick_report`): the diff it made against the workspace as it was before the delegation, the tests it
ran and their last result, how it ended, and its last message; then the review of the change so far
(`review`, `FusionConfig.review`, on by default): the visible tests before and after the change and the
verifier's exploit checks against them, as `flywheel review` makes one, ending in `review: approve` or
`review: request changes` with the reasons (the review's test runs are not priced, like the report's
other lines). The lead may then review further (view, run_tests), delegate again with corrections, take
over and edit itself, or submit. A sidekick that crashes
or runs out of budget is such a report, never a crashed attempt.

The attempt is graded once, at the lead's end (a sidekick's episode in a borrowed workspace is not
graded); the exploit detector reads both sides' actions. Each side keeps its own budgets and cost: the
lead's budgets count its own turns, tokens and seconds (a delegation's time is the sidekick's, not the
lead's tool time). The record is the lead's (`flywheel.record.Trajectory`) with its `cost` the sum of both
sides', `fusion` splitting it (`lead_cost`, `sidekick_cost`, `delegations`, `take_overs`), and the
sidekick's episodes nested whole in `sidekick`, so that either side can be trained on later.

What is not covered: each delegation starts the sidekick from a fresh conversation (it knows earlier delegations only through the
workspace and the lead's words); a take-over is counted when the lead's own call changes the workspace
after a delegation (an `edit`, or a `shell` command that writes a file, even one it then undoes).

Modules: `pair` (`Fusion`, the lead's episodes and their delegations, and the attempt's record),
`sidekick` (a delegation's episode, its batches and its report), `review` (`LeadReview`, the review in
each report), `rollout` (`sidekick_rollout`: the pair
with `rollout`'s signature, for training the sidekick under a frozen lead, `[fusion]`), `compare` (the
lead alone, the sidekick alone and the pair, side by side). The oracle-backed lead of tests and demos is a
model like the others, `scripted-lead` (`flywheel.models.scripted_lead`).
"""

from flywheel.fusion.compare import POLICIES, compare_rows, compare_table, run_compare
from flywheel.fusion.pair import LEAD_HELP, Fusion, FusionConfig, attach, take_overs
from flywheel.fusion.rollout import lead_model, sidekick_rollout
from flywheel.fusion.sidekick import SidekickBatches, crashed, sidekick_report, sidekick_spec

__all__ = [
    "LEAD_HELP",
    "POLICIES",
    "Fusion",
    "FusionConfig",
    "SidekickBatches",
    "attach",
    "compare_rows",
    "compare_table",
    "crashed",
    "lead_model",
    "run_compare",
    "sidekick_report",
    "sidekick_rollout",
    "sidekick_spec",
    "take_overs",
]
