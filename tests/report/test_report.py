"""`flywheel report`: the page of a real eval and a real one-step training run, read as data and, in headless
Chromium, as a person sees it (plots drawn, a row's click opening its trajectory, a screenshot not blank)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flywheel.cli import main
from flywheel.eval import run_eval
from flywheel.models.scripted import ScriptedModel
from flywheel.record import read_trajectories, write_trajectories
from flywheel.report import collect, embed_json, policy_name, render, write_report
from flywheel.rl.calibrate import calibrate

HOSTILE = "</script><img src=x onerror=\"document.title='pwned'\"><b>bold</b> & <!--"


def attempts(html: str) -> list[dict]:
    [data] = re.findall(r'<script type="application/json" id="attempts-data">(.*?)</script>', html, re.S)
    return json.loads(data)


@pytest.fixture
def eval_run(clamp_task, tmp_path) -> Path:
    out = tmp_path / "eval"
    run_eval([clamp_task], ScriptedModel(), out)
    return out


@pytest.fixture
def demo_dir(eval_run, one_step_run, tmp_path) -> Path:
    """runs/demo's layout from real runs: eval-base and eval-trained per effort, train/, calibration/,
    results.json; one trained attempt's text is hostile markup."""
    demo = tmp_path / "demo"
    [record] = read_trajectories(eval_run / "trajectories.jsonl")
    for policy in ("base", "trained"):
        (demo / f"eval-{policy}" / "medium").mkdir(parents=True)
        shutil.copy(eval_run / "trajectories.jsonl", demo / f"eval-{policy}" / "medium")
    record.turns[-1]["text"] = HOSTILE
    record.success = record.verdict.success = False
    write_trajectories(demo / "eval-trained" / "medium" / "trajectories.jsonl", [record])
    shutil.copytree(one_step_run, demo / "train", ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    cal = calibrate({"medium": [(0.01, 0.2), (0.02, 0.5), (0.04, 0.6)]}, {"medium": (0.02, 0.5)})
    (demo / "calibration").mkdir()
    data = {**cal.to_json(), "ladders": {"medium": [[0.5, 0.01, 0.2], [1.0, 0.02, 0.5], [2.0, 0.04, 0.6]]}}
    (demo / "calibration" / "calibration.json").write_text(json.dumps(data))
    return demo


def test_policy_names_follow_the_run_layout(tmp_path):
    demo = tmp_path / "demo"
    assert policy_name(demo, demo / "eval-base" / "medium", "") == "base"
    assert policy_name(demo, demo / "train", "") == "train"
    assert policy_name(demo, demo, "") == "demo"
    assert policy_name(demo, demo / "eval-base" / "max", "a") == "a/base"


def test_embedded_json_cannot_end_its_script_element():
    text = embed_json({"t": HOSTILE, "nan": float("nan")})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"t": HOSTILE, "nan": None}


def test_the_report_of_an_eval_has_its_point_summary_and_attempt(eval_run, tmp_path, capsys):
    out = tmp_path / "r" / "report.html"
    main_exit(["report", str(eval_run), "--out", str(out)])
    assert capsys.readouterr().out.startswith(f"{out} (")
    html = out.read_text()
    assert not re.search(r"\b(src|href)\s*=", html)  # nothing to fetch: every style, script and plot inline
    assert html.count('class="pt"') == 1 and "100.0%" in html  # one (policy, effort) point, solved
    [row] = attempts(html)
    assert (row["task"], row["success"], row["reward"], row["kind"]) == ("clamp-1", True, 1.0, "eval")
    assert all("token_ids" not in t and "logprobs" not in t for t in row["record"]["turns"])


def test_the_demo_layout_gives_every_section(demo_dir):
    rep = collect([demo_dir])
    assert set(rep.points) == {("base", "medium"), ("trained", "medium")}
    assert [c.label for c in rep.curves] == ["train"] and rep.curves[0].minutes
    assert [n for n, _ in rep.calibrations] == ["calibration"]
    train_rows = [a for a in rep.attempts if a["kind"] == "train"]
    assert train_rows and all(a["reward"] == a["record"]["rl"]["reward"] for a in train_rows)
    html = render(rep)
    for section in ('id="score"', 'id="curves"', 'id="calibration"', 'id="attempts"'):
        assert section in html
    for metric in ("reward", "success", "kl_k3", "is_weight_mean", "is_ratio_max", "clip_frac", "entropy"):
        assert f"<figcaption>{metric}</figcaption>" in html
    assert HOSTILE not in html and "<img" not in html


def test_an_unreadable_run_directory_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(SystemExit) as e:
            main(["report", str(bad), "--out", str(tmp_path / "r.html")])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and str(bad) in err
    assert not (tmp_path / "r.html").exists()


def main_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0


# ------------------------------------------------------------------------------------ in a real browser


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("chromium is not installed (`make install` installs it as root on Debian)")
    flags = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars"]
    cmd = [exe, *flags, f"--user-data-dir={cwd / 'profile'}", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=True)


def test_in_a_browser_the_plots_are_drawn_and_a_row_opens_its_trajectory(demo_dir, tmp_path):
    from PIL import Image

    page = write_report([demo_dir], tmp_path / "report.html")
    dom = chromium("--dump-dom", page.as_uri() + "#click-first-row", cwd=tmp_path).stdout
    score = dom[dom.index('id="score"') : dom.index('id="curves"')]
    assert score.count('class="pt"') == 2 and score.count('class="err"') == 2  # two points, intervals
    assert dom.count("<svg") >= 10 and '<polyline class="line"' in dom
    assert re.search(r'<span id="count">\d+ of \d+ attempts</span>', dom)
    rows = re.findall(r'<tr data-index="\d+"', dom)
    assert len(rows) == len(collect([demo_dir]).attempts) > 2
    pane = dom[dom.index('id="trajectory"') :]
    assert "clamp-1 · medium · base" in pane and "Verdict: success" in pane and "reward at λ=0" in pane
    assert 'class="turn assistant"' in pane and 'class="turn tool' in pane  # every turn, each tool call
    assert "<title>pwned" not in dom and "<img" not in dom  # the hostile record's markup stayed text

    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri(), cwd=tmp_path)
    with Image.open(shot) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert im.size == (1280, 2000) and len(colours) > 50  # drawn, not a blank page


def test_in_a_browser_the_hostile_attempt_renders_as_text(demo_dir, tmp_path):
    page = write_report([demo_dir / "eval-trained"], tmp_path / "report.html")
    dom = chromium("--dump-dom", page.as_uri() + "#click-first-row", cwd=tmp_path).stdout
    assert "<img" not in dom and "<b>bold</b>" not in dom
    assert "&lt;/script&gt;&lt;img src=x" in dom and "Verdict: failure" in dom
    assert "<title>Flywheel report" in dom  # the page's title, untouched by the record's script
