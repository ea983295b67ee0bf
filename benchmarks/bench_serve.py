"""`flywheel serve` under concurrent clients: requests per second, latency, and time to the first streamed
content, with the real `openai` SDK.

`--clients` threads (16 by default), each with its own `openai.OpenAI` client, send chat completions to one
`flywheel serve --model MODEL` subprocess on loopback for `--seconds`, first whole answers and then
streamed ones (`stream: true`), every request the same task message at temperature 1 with
`--max-tokens`. The server batches what arrives together, so the figure to compare is requests per second
against one client's: `--clients 1` gives the baseline in the same run.

Streaming: from the torch engine the server sends each token's text as it is sampled, so the time to the
first streamed content is about one batch's prefill and first step, not the whole generation (compare it
with the whole answer's latency in the same run; docs/configuration.md, "Serving").

    .venv/bin/python benchmarks/bench_serve.py --model toybugs-sweep --seconds 30
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

TASK = (
    "Running `clamp(5.5, 0, 5)` returns 5.5, which it should not. The code is in `mathx.py`. The failing case "
    "is reproduced by the tests in `tests/test_mathx.py`.\n\nFiles:\nmathx.py\ntests/test_mathx.py"
)


def start_server(model: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "serve", "--model", model, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"(http://\S+)", line)
    if not found:
        proc.terminate()
        raise SystemExit(f"flywheel serve did not start: {line.strip()!r}")
    return proc, found.group(1)


def load(url: str, clients: int, seconds: float, stream: bool, max_tokens: int) -> dict[str, float]:
    """Every client asks again as soon as it has its answer, until `seconds` have passed."""
    ask = {
        "model": "m",
        "messages": [{"role": "user", "content": TASK}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
    }
    latencies: list[float] = []
    firsts: list[float] = []
    tokens: list[int] = []
    stop = time.monotonic() + seconds

    def client() -> None:
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
        while time.monotonic() < stop:
            t = time.monotonic()
            if stream:
                first = None
                for chunk in c.chat.completions.create(**ask, stream=True):
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.monotonic() - t
                firsts.append(first if first is not None else time.monotonic() - t)
            else:
                tokens.append(c.chat.completions.create(**ask).usage.completion_tokens)
            latencies.append(time.monotonic() - t)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    out = {
        "requests": len(latencies),
        "req_per_s": len(latencies) / elapsed,
        "latency_p50_s": statistics.median(latencies),
    }
    if stream:
        out["first_content_p50_s"] = statistics.median(firsts)
    else:
        out["completion_tokens_mean"] = statistics.fmean(tokens)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="toybugs-sweep")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args()
    proc, url = start_server(args.model)
    try:
        rows = []
        for clients in (1, args.clients):
            for stream in (False, True):
                r = load(url, clients, args.seconds, stream, args.max_tokens)
                rows.append((clients, stream, r))
        print(f"flywheel serve --model {args.model}, {args.seconds:g} s per row")
        print(f"{'clients':>7s} {'stream':>6s} {'requests':>8s} {'req/s':>7s} {'p50 s':>6s} {'first s':>7s}")
        for clients, stream, r in rows:
            first = f"{r['first_content_p50_s']:7.2f}" if stream else f"{'-':>7s}"
            print(
                f"{clients:7d} {str(stream):>6s} {r['requests']:8d} {r['req_per_s']:7.2f} "
                f"{r['latency_p50_s']:6.2f} {first}"
            )
        base = next(r["req_per_s"] for c, s, r in rows if c == 1 and not s)
        top = next(r["req_per_s"] for c, s, r in rows if c == args.clients and not s)
        print(f"{args.clients} clients against 1: {top / base:.2f}x the requests per second")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
