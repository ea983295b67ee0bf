"""Guarantee 4: stdout and stderr are captured interleaved and kept to a head and a tail."""

from __future__ import annotations

import re

from flywheel.protocols import Limits
from flywheel.sandbox.output import OutputBuffer, marker, truncate


def test_short_output_is_kept_whole():
    assert truncate(b"hello\n", 100) == ("hello\n", False)
    assert truncate(b"x" * 100, 100) == ("x" * 100, False)


def test_long_output_keeps_head_and_tail_with_a_marker():
    data = b"HEAD" + b"." * 10_000 + b"TAIL"
    text, truncated = truncate(data, 100)
    assert truncated
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert marker(len(data) - 100) in text
    assert len(text) == 100 + len(marker(len(data) - 100))


def test_chunked_feed_equals_one_feed():
    data = bytes(range(256)) * 400
    buf = OutputBuffer(1000)
    for i in range(0, len(data), 777):
        buf.feed(data[i : i + 777])
    assert buf.render() == truncate(data, 1000)


def test_zero_limit_keeps_only_the_marker():
    assert truncate(b"abc", 0) == (marker(3), True)


def test_stdout_and_stderr_interleave_in_order(sandbox, ws):
    script = "echo o1; echo e1 >&2; echo o2; echo e2 >&2"
    result = sandbox.run(ws, ["sh", "-c", script])
    assert result.output == "o1\ne1\no2\ne2\n"
    assert not result.truncated


def test_flood_is_truncated(sandbox, ws, py):
    code = "import sys; sys.stdout.write('BEGIN' + 'x' * 5_000_000 + 'END')"
    result = sandbox.run(ws, py(code), limits=Limits(output_bytes=1000))
    assert result.exit_code == 0
    assert result.truncated
    assert result.output.startswith("BEGIN") and result.output.endswith("END")
    dropped = int(re.search(r"\[\.\.\. (\d+) bytes truncated \.\.\.\]", result.output).group(1))
    assert dropped == 5_000_008 - 1000
