import json

import pytest

from flywheel.eval import paired_gain, run_eval, summarize, wilson_interval
from flywheel.models.scripted import ScriptedModel
from flywheel.protocols import Verdict
from flywheel.record import Trajectory, read_trajectories


def rec(success, cost, turns, first_edit, ending="submitted"):
    return Trajectory(
        "t/medium/s0/0",
        "t",
        "medium",
        success=success,
        cost=cost,
        n_turns=turns,
        steps_to_first_edit=first_edit,
        completion_tokens=10,
        ending=ending,
        format_errors=1,
        verdict=Verdict("t", success=success),
    )


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_summarize_counts_everything():
    s = summarize([rec(True, 0.1, 4, 2), rec(False, 0.3, 10, None, "turn_limit"), rec(True, 0.2, 6, 4)])
    assert s["n"] == 3 and s["success_rate"] == pytest.approx(2 / 3)
    assert s["mean_cost"] == pytest.approx(0.2) and s["median_cost"] == pytest.approx(0.2)
    assert s["mean_turns"] == pytest.approx(20 / 3) and s["median_steps_to_first_edit"] == 3
    assert s["endings"] == {"submitted": 2, "turn_limit": 1} and s["format_errors"] == 3


def test_summarize_reports_infrastructure_failures_apart():
    outage = [rec(False, 9.0, 1, None, "model_error"), rec(False, 9.0, 1, None, "model_error")]
    outage[0].infra_failure = outage[1].infra_failure = "model_server"
    broken = rec(True, 9.0, 30, 1)
    broken.infra_failure = "grader"
    s = summarize([rec(True, 0.1, 4, 2), rec(False, 0.3, 10, None, "turn_limit"), *outage, broken])
    assert (s["n"], s["n_valid"], s["infra_failures"]) == (5, 2, 3)
    assert s["infra_causes"] == {"grader": 1, "model_server": 2}
    assert (
        s["success_rate"] == 0.5 and s["successes"] == 1 and s["success_ci95"] == list(wilson_interval(1, 2))
    )
    assert (
        s["mean_cost"] == pytest.approx(0.2) and s["mean_turns"] == 7 and s["median_steps_to_first_edit"] == 2
    )
    assert s["endings"] == {"model_error": 2, "submitted": 2, "turn_limit": 1}  # every ending still counted
    assert summarize(outage)["success_rate"] == 0.0 and summarize(outage)["n_valid"] == 0


def outcomes(both, before_only, after_only, neither):
    """Records of two policies on the same tasks with these counts of paired outcomes."""
    cells = [(True, True)] * both + [(True, False)] * before_only + [(False, True)] * after_only
    cells += [(False, False)] * neither
    first = [
        Trajectory(id=f"t{i}/a", task_id=f"t{i}", effort="max", success=s) for i, (s, _) in enumerate(cells)
    ]
    second = [
        Trajectory(id=f"t{i}/b", task_id=f"t{i}", effort="max", success=s) for i, (_, s) in enumerate(cells)
    ]
    return first, second


def unpaired(before, after):
    """Newcombe's interval for two independent proportions, from the same Wilson intervals."""
    s1, s2 = summarize(before), summarize(after)
    (p1, (l1, u1)), (p2, (l2, u2)) = (
        (s1["success_rate"], s1["success_ci95"]),
        (s2["success_rate"], s2["success_ci95"]),
    )
    d = p2 - p1
    return d - ((p2 - l2) ** 2 + (u1 - p1) ** 2) ** 0.5, d + ((u2 - p2) ** 2 + (p1 - l1) ** 2) ** 0.5


def test_paired_gain_counts_the_pairs_and_narrows_the_interval_when_outcomes_agree():
    before, after = outcomes(12, 11, 14, 63)
    g = paired_gain(before, after)
    assert (g["n"], g["both"], g["before_only"], g["after_only"], g["neither"]) == (100, 12, 11, 14, 63)
    assert g["gain"] == pytest.approx(0.03)
    lo, hi = g["ci95"]
    assert lo < 0.03 < hi and lo < 0 < hi  # 3 discordant pairs more out of 25 is no evidence
    u_lo, u_hi = unpaired(before, after)
    assert u_lo < lo and hi < u_hi  # the agreeing pairs carry no difference: a narrower interval
    swapped = paired_gain(after, before)
    assert swapped["gain"] == pytest.approx(-0.03)
    assert swapped["ci95"] == pytest.approx([-hi, -lo])


def test_paired_gain_excludes_zero_for_a_consistent_gain_and_leaves_out_unmatched_tasks():
    before, after = outcomes(20, 1, 15, 64)
    assert paired_gain(before, after)["ci95"][0] > 0
    before[0].infra_failure = "sandbox"  # a (True, True) pair the infrastructure ended before
    g = paired_gain(before, after[:-1])  # and a task the second policy never attempted
    assert g["n"] == 98 and g["both"] == 19 and g["neither"] == 63
    assert paired_gain([], after)["n"] == 0
    same = paired_gain(*outcomes(10, 0, 0, 90))
    assert same["gain"] == 0 and same["ci95"][0] < 0 < same["ci95"][1]


def test_run_eval_writes_trajectories_and_summary(clamp_task, tmp_path):
    out = tmp_path / "run"
    summary = run_eval([clamp_task], ScriptedModel(), out)
    assert summary["n"] == 1 and summary["success_rate"] == 1.0
    assert json.loads((out / "summary.json").read_text())["success_ci95"] == summary["success_ci95"]
    [record] = read_trajectories(out / "trajectories.jsonl")
    assert record.task_id == "clamp-1" and record.verdict.success is True


def test_a_torn_last_line_is_skipped(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(rec(True, 0.1, 1, 1).to_json()) + "\n" + '{"success": tr')
    assert len(read_trajectories(p)) == 1


def test_existing_results_are_not_overwritten(clamp_task, tmp_path):
    out = tmp_path / "run"
    run_eval([clamp_task], ScriptedModel(), out)
    before = (out / "trajectories.jsonl").read_text()
    with pytest.raises(Exception, match="exists"):
        run_eval([clamp_task], ScriptedModel(), out)
    assert (out / "trajectories.jsonl").read_text() == before
