from flywheel.progress import progress


def test_plain_lines_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_PROGRESS_EVERY", "0")
    with progress("collecting", 3) as advance:
        advance()
        advance(2, success=0.5)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("collecting: 1/3  0:00")
    assert lines[1].startswith("collecting: 3/3") and lines[1].endswith("success=0.5")
    assert lines[2] == lines[1]  # the closing line


def test_quiet_lines_between_intervals_and_silence_on_request(capsys, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_PROGRESS_EVERY", "3600")
    with progress("sft", 100) as advance:
        for _ in range(100):
            advance(loss=1.25)
    assert capsys.readouterr().err.splitlines() == ["sft: 100/100  0:00  loss=1.25"]
    monkeypatch.setenv("FLYWHEEL_PROGRESS", "0")
    with progress("sft", 2) as advance:
        advance()
    assert capsys.readouterr().err == ""
