"""`flywheel report`: run directories in, one self-contained HTML page out.

`collect(paths)` reads what it finds under each run directory, to a depth of three, into a `Report`:

- an evaluation (`flywheel eval --out`: `trajectories.jsonl`, `summary.json`; the demo's
  `eval-<policy>/<effort>/`): one point of success against cost per (policy, effort), and its attempts;
- a training run (`metrics.jsonl`, `timings.jsonl`, `config.json`, `trajectories.jsonl`): learning
  curves and the attempts trained on, each with the trainer's reward;
- a calibration (`calibration.json`): the ladder of budgets per effort level and the λ chosen;
- a `results.json` (`{policy: {effort: summary}}`, as the demo writes): the summaries of its policies'
  points, in place of the ones recomputed from the records.

`render(report)` is a pure function from that data to the page: charts are inline SVG (`flywheel.report.svg`),
styles and the one script (`report.css`, `report.js`) are inlined, and the attempts are embedded as JSON
(without per-token data) that the script renders with `textContent` only. Nothing in the page loads from
the network; a trajectory's text cannot inject markup (`embed_json` escapes `<`, `>` and `&`).

A policy's name is its directory's path under the run directory, without an effort level's folder and
an `eval-` prefix (`runs/demo/eval-base/medium` is `base`); with several run directories, each name
starts with its run's.

Modules: `collect` (reading run directories into a `Report`), `page` (`render` and `write_report`),
`svg` (the charts).
"""

from flywheel.report.collect import Curve, Report, collect, policy_name, read_run, run_dirs
from flywheel.report.page import embed_json, render, write_report

__all__ = [
    "Curve",
    "Report",
    "collect",
    "embed_json",
    "policy_name",
    "read_run",
    "render",
    "run_dirs",
    "write_report",
]
