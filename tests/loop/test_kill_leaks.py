"""Kills at random moments, then nothing left: pools, trainers and following servers killed -9 mid-run.

Two runs of the real `flywheel train` command on the shipped base (`toybugs-sweep`), whose episodes run
the agent's commands and the grader in the sandbox (bwrap, warm pytest parents, per-run cgroups):

1. `local` backend: pool processes and the trainer (driver and trainer: one process) are killed with
   SIGKILL at random moments; each killed trainer is started again with the same command, which resumes.
2. `http` backend: two `flywheel serve --follow` servers; a server is killed at a random moment and
   started again on its port a random moment later; the trainer (which runs the episodes here) too.

The moments come from a seeded schedule (`Schedule`): a trainer is killed once it has published a random
number (0 to 2) of new versions since it started, a random delay later (so some kills land in its start:
the task environment's build, the restore, the pools' start); a pool a random delay after it is ready.
The seed is printed, named in every failure, and `FLYWHEEL_KILL_SEED=N` replays a schedule (the moments
it chooses, not the machine's timing). Each run has a private TMPDIR and task-environment cache (one task
of the suite has an environment, built by the first trainer), so what is left can be counted exactly.

Then, `flywheel.loop.leftovers.find_leftovers` must find nothing: no process of the run (a sandbox's
bwrap, a pool, a server), no cgroup of its processes, nothing flywheel made in the temp dir, no torn
record, no incomplete checkpoint (local or peer), no half-written store object, no half-built
environment; the temp dir holds nothing else but torch's compile cache. And every run ends at its last
step: every step's metrics line once, in order, and every record used once.

`test_kills_at_random_moments_leave_nothing_behind` is the short version CI runs (`make test-faults`);
`test_two_hundred_episodes_under_random_kills` the full one (at least 200 episodes; `-m slow`).
"""

from __future__ import annotations

import getpass
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flywheel.loop.checkpoint import Checkpointer
from flywheel.loop.leftovers import checkpoints, find_leftovers, processes
from flywheel.sync import FsspecStore
from flywheel.tasks import load_suite

SEED = int(os.environ.get("FLYWHEEL_KILL_SEED") or random.SystemRandom().randrange(1 << 31))
ENV_TASK_REQUIREMENTS = '["greetlib==1.0"]'  # a wheel of the tests' own (`offline_envs`)
TORCH_CACHE = f"torchinductor_{getpass.getuser()}"  # torch's compile cache, shared by every run
RUN_WAIT_S = 900  # longest one life of the trainer may take


@dataclass(frozen=True)
class Size:
    steps: dict[str, int]  # per backend
    trainer_kills: dict[str, int]
    pool_kills: dict[str, int]
    tasks_per_step: int = 2
    group_size: int = 2


SHORT = Size(
    steps={"local": 4, "http": 3}, trainer_kills={"local": 1, "http": 1}, pool_kills={"local": 2, "http": 2}
)
FULL = Size(
    steps={"local": 16, "http": 10}, trainer_kills={"local": 4, "http": 3}, pool_kills={"local": 6, "http": 5},
    tasks_per_step=4,
)  # fmt: skip


# ------------------------------------------------------------------------------------------ the schedule


@dataclass(frozen=True)
class Schedule:
    """The moments of one run: when each killed life of the trainer ends, and the pool kills (each armed
    once a pool is up; one its life did not reach passes to the next life)."""

    trainer: tuple[tuple[int, float], ...]  # per killed life: (new versions to wait for, then seconds)
    pools: tuple[tuple[float, int, float], ...]  # (seconds after a pool is up, which, seconds down)

    @classmethod
    def draw(cls, rng: random.Random, trainer_kills: int, pool_kills: int) -> Schedule:
        trainer = tuple((rng.randint(0, 2), round(rng.uniform(0.0, 6.0), 2)) for _ in range(trainer_kills))
        pools = tuple(
            (round(rng.uniform(0.5, 8.0), 2), rng.randrange(2), round(rng.uniform(0.5, 4.0), 2))
            for _ in range(pool_kills)
        )
        return cls(trainer, pools)


# --------------------------------------------------------------------------------------------- the runs


def suite(dest: Path, n: int) -> Path:
    """`n` toybugs train tasks (of different modules); the first needs a task environment."""
    tasks = load_suite("toybugs", split="train")
    for task in tasks[:: max(1, len(tasks) // n)][:n]:
        shutil.copytree(task.root, dest / task.id)
    first = dest / sorted(p.name for p in dest.iterdir())[0] / "task.toml"
    first.write_text(first.read_text() + f"\n[environment]\nrequirements = {ENV_TASK_REQUIREMENTS}\n")
    return dest


def config(tasks: Path, size: Size, backend: str, loop: str) -> str:
    return f"""
seed = {SEED % 1000}
[model]
path = "toybugs-sweep"
max_context = 2048
[tasks]
suite = "{tasks}"
[rollout]
efforts = ["medium"]
tasks_per_step = {size.tasks_per_step}
group_size = {size.group_size}
concurrency = 4
max_turns = {{ medium = 3 }}
max_tokens = {{ medium = 600 }}
[reward]
lambdas = {{ medium = 10.0 }}
[optim]
lr = 5e-4
[train]
steps = {size.steps[backend]}
threads = 1
[loop]
backend = "{backend}"
pool_batch = 2
max_staleness = 1
max_restarts = 50
catch_up_wait_s = 20.0
{loop}
"""


def lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


@dataclass
class Run:
    """One run directory, its command's environment, and what was killed in it."""

    out: Path
    cfg: Path
    env: dict[str, str]
    pids: set[int] = field(default_factory=set)  # every process of the run: trainers, pools, servers
    kills: list[dict] = field(default_factory=list)
    lives: int = 0

    def start(self) -> subprocess.Popen:
        argv = [sys.executable, "-m", "flywheel", "train", str(self.cfg), "--out", str(self.out)]
        log = open(self.out.parent / f"{self.out.name}-{self.lives}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.lives += 1
        self.pids.add(proc.pid)
        return proc

    def events(self) -> list[dict]:
        return lines(self.out / "events.jsonl")

    def kill(self, pid: int, what: str, **info) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False  # it had just ended
        self.kills.append({"what": what, "pid": pid, "t": round(time.monotonic(), 2), **info})
        return True


class Servers:
    """`flywheel serve --follow STORE` servers on fixed loopback ports, killed and restarted at will."""

    def __init__(self, run: Run, store: Path, n: int) -> None:
        self.run, self.store = run, store
        self.ports = [free_port() for _ in range(n)]
        self.procs: dict[int, subprocess.Popen] = {}
        self.back_at: dict[int, float] = {}  # killed servers: when to start them again

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/v1" for p in self.ports]

    def start(self, i: int) -> None:
        argv = [sys.executable, "-m", "flywheel", "serve", "--model", "toybugs-sweep"]
        argv += ["--port", str(self.ports[i]), "--follow", str(self.store)]
        log = open(self.run.out.parent / f"serve-{i}.log", "a")  # noqa: SIM115
        proc = subprocess.Popen(argv, env=self.run.env, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        line = proc.stdout.readline()
        assert line.startswith("serving "), f"server {i} did not start (seed {SEED})"
        self.procs[i] = proc
        self.run.pids.add(proc.pid)

    def kill(self, i: int, down_s: float) -> None:
        proc = self.procs.pop(i)
        self.run.kill(proc.pid, f"server-{i}", down_s=down_s)
        proc.wait()
        proc.stdout.close()
        self.back_at[i] = time.monotonic() + down_s

    def tick(self, now: bool = False) -> None:
        """Start again the killed servers whose time down is over (`now`: all of them)."""
        for i, at in list(self.back_at.items()):
            if now or time.monotonic() >= at:
                del self.back_at[i]
                self.start(i)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=30)
            proc.stdout.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- killing a life


def pools_up(run: Run, since: int, servers: Servers | None) -> list[str]:
    """The pools that can be killed now, sorted: pool processes ready in this life and not lost since (as
    `pool:pid`), or, once the backend has started (a server that does not answer then is refused), the
    servers running."""
    events = run.events()[since:]
    if servers is not None:
        started = any(e["event"] == "pool_ready" for e in events)
        return [f"server-{i}" for i in sorted(servers.procs)] if started else []
    pids: dict[str, int] = {}
    for e in events:
        if e["event"] == "pool_ready":
            pids[e["pool"]] = e["pid"]
        elif e["event"] == "lost":
            pids.pop(e["pool"], None)
    return sorted(f"{pool}:{pid}" for pool, pid in pids.items())


def kill_pool(run: Run, name: str, down_s: float, servers: Servers | None) -> None:
    if servers is not None:
        servers.kill(int(name.split("-")[1]), down_s)
    else:
        pool, pid = name.split(":")
        run.kill(int(pid), pool)


def due(wanted: int, versions: list[int], first: int | None) -> bool:
    """Whether a life that started at version `first` has published `wanted` new versions."""
    return wanted == 0 or (first is not None and versions[-1] >= first + wanted)


def one_life(run: Run, trainer: tuple[int, float] | None, pools: list, servers: Servers | None) -> bool:
    """Start the trainer; kill it at the `trainer` moment (None: never) and pools at the moments `pools`
    lists (taking those it reaches off the list); True when this life ended the run (exit 0)."""
    since = len(run.events())
    if servers is not None:
        servers.tick(now=True)  # a trainer starts only with every server answering
    proc = run.start()
    trainer_at, pool_at, first, killed = None, None, None, False
    deadline = time.monotonic() + RUN_WAIT_S
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"a trainer's life took over {RUN_WAIT_S} s (seed {SEED})"
        now, events = time.monotonic(), run.events()[since:]
        if servers is not None:
            servers.tick()
        versions = [e["version"] for e in events if e["event"] in ("resumed", "published")]
        first = versions[0] if first is None and versions else first
        if trainer and trainer_at is None and due(trainer[0], versions, first):
            trainer_at = now + trainer[1]
        if trainer_at is not None and now >= trainer_at:
            killed = run.kill(proc.pid, "trainer", version=versions[-1] if versions else None)
            break
        up = pools_up(run, since, servers)
        if pool_at is None and pools and up:
            pool_at = now + pools[0][0]
        if pool_at is not None and now >= pool_at and up:
            _, which, down_s = pools.pop(0)
            kill_pool(run, up[which % len(up)], down_s, servers)
            pool_at = None
        time.sleep(0.05)
    code = proc.wait(timeout=60)
    run.pids.update(
        int(e["pid"]) for e in run.events()[since:] if e["event"] == "pool_ready" and e.get("pid")
    )
    if not killed:
        assert code == 0, f"the trainer exited with {code} (seed {SEED}); see {run.out.parent}"
    return not killed


def drive(run: Run, schedule: Schedule, servers: Servers | None = None) -> None:
    """Lives of the trainer until one ends the run: one per planned trainer kill, then one not killed."""
    pools = list(schedule.pools)
    for trainer in [*schedule.trainer, None]:
        if one_life(run, trainer, pools, servers):
            return
    raise AssertionError(f"the run did not end (seed {SEED})")


# ----------------------------------------------------------------------------------------- the checks


def check_finished(run: Run, steps: int) -> int:
    """The run ended at its last step, every step once and every record used once; returns the episodes
    recorded (used and dropped as stale)."""
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["version"] == steps, (summary, SEED)
    metrics = lines(run.out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), SEED
    used = lines(run.out / "trajectories.jsonl")
    ids = [r["id"] for r in used]
    assert len(ids) == len(set(ids)) == sum(m["loop_records"] for m in metrics), SEED
    assert sorted({r["step"] for r in used}) == list(range(1, steps + 1)), SEED
    resumed = [e["version"] for e in run.events() if e["event"] == "resumed"]
    assert 1 <= len(resumed) <= run.lives and resumed == sorted(resumed), (resumed, SEED)
    return len(used) + len(lines(run.out / "dropped.jsonl"))


def left_behind(run: Run, tmp: Path, envs: Path) -> list[str]:
    """What the run left (`find_leftovers`), anything else in its temp dir but torch's cache, and an
    environment cache that does not hold the one environment, built. Processes get 30 s to finish ending
    (a pool whose trainer was killed ends at its next message)."""
    deadline = time.monotonic() + 30
    while list(processes([run.out, tmp])) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = [str(f) for f in find_leftovers(run.out, tmp_dir=tmp, env_cache=envs, pids=run.pids)]
    named = {f.split(": ", 1)[1].split(" ")[0] for f in found}
    found += [f"temp: {p}" for p in sorted(tmp.iterdir()) if p.name != TORCH_CACHE and str(p) not in named]
    built = [p.name for p in envs.iterdir() if p.is_dir() and (p / "flywheel-env.json").is_file()]
    if len(built) != 1:
        found.append(f"environment: {len(built)} built in {envs}, not 1")
    return found


# ------------------------------------------------------------------------------------------- the test


def one_run(backend: str, size: Size, tmp_path: Path, env: dict, rng: random.Random, capsys) -> dict:
    """One run of `backend` under its schedule, to its last step; returns its report (episodes, kills,
    lives, seconds, and what it left)."""
    # TMPDIR as short as /tmp's children are: a UNIX socket's path (multiprocessing's forkserver listens on
    # one under it) has room for about 100 bytes, and pytest's own temporary paths are long
    tmp = Path(tempfile.mkdtemp(prefix=f"kill-{backend}-", dir="/tmp"))
    envs, out = tmp_path / f"envs-{backend}", tmp_path / backend
    out.mkdir()
    run = Run(out, tmp_path / f"{backend}.toml", {**env, "TMPDIR": str(tmp), "FLYWHEEL_ENV_CACHE": str(envs)})
    servers, loop = None, "pools = 2"
    if backend == "http":
        servers = Servers(run, out / "weights", 2)
        loop = f'pool_urls = {json.dumps(servers.urls)}\nstore = "{out / "weights"}"'
        for i in range(2):
            servers.start(i)
    run.cfg.write_text(config(tmp_path / "tasks", size, backend, loop))
    plan = Schedule.draw(rng, size.trainer_kills[backend], size.pool_kills[backend])
    with capsys.disabled():
        print(f"kill test: {backend}: {plan}", flush=True)
    t0 = time.monotonic()
    try:
        drive(run, plan, servers)
    finally:
        if servers is not None:
            servers.stop()
    try:
        episodes = check_finished(run, size.steps[backend])
        return {
            "episodes": episodes, "kills": run.kills, "lives": run.lives, "seconds": round(time.monotonic() - t0),
            "left": left_behind(run, tmp, envs),
        }  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def kill_test(size: Size, tmp_path: Path, wheels: Path, capsys) -> dict:
    """Both runs; nothing may be left by either. Returns the report (also `kill-report.json`)."""
    with capsys.disabled():
        print(f"\nkill test: seed {SEED} (FLYWHEEL_KILL_SEED={SEED} replays the schedule)", flush=True)
    suite(tmp_path / "tasks", 6)
    env = {**os.environ, "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(wheels)}
    rng = random.Random(SEED)
    report = {"seed": SEED, **{b: one_run(b, size, tmp_path, env, rng, capsys) for b in ("local", "http")}}
    (tmp_path / "kill-report.json").write_text(json.dumps(report, indent=1))
    with capsys.disabled():
        print(f"kill test: {json.dumps(report)}", flush=True)
    left = [f"{b}: {f}" for b in ("local", "http") for f in report[b]["left"]]
    assert not left, f"seed {SEED}: left behind:\n" + "\n".join(left)
    return report


def kills_of(report: dict, backend: str, what: str) -> int:
    return sum(k["what"].startswith(what) for k in report[backend]["kills"])


@pytest.mark.slow
@pytest.mark.fault
def test_kills_at_random_moments_leave_nothing_behind(tmp_path, offline_envs, capsys):
    report = kill_test(SHORT, tmp_path, offline_envs, capsys)
    assert kills_of(report, "local", "pool") >= 1 and kills_of(report, "http", "server") >= 1, report
    assert kills_of(report, "local", "trainer") >= 1, report


@pytest.mark.slow
def test_two_hundred_episodes_under_random_kills(tmp_path, offline_envs, capsys):
    report = kill_test(FULL, tmp_path, offline_envs, capsys)
    assert report["local"]["episodes"] + report["http"]["episodes"] >= 200, report
    assert kills_of(report, "local", "pool") >= 3 and kills_of(report, "http", "server") >= 3, report
    assert kills_of(report, "local", "trainer") >= 2 and kills_of(report, "http", "trainer") >= 1, report


# ------------------------------------------------------------------------------ the checks, one by one


@dataclass
class Counter:
    """A trainer's checkpointing contract with one number for its state."""

    version: int

    def save(self, dir: Path) -> None:
        dir.mkdir()
        (dir / "state.json").write_text(json.dumps({"version": self.version}))

    def load(self, dir: Path) -> None:
        self.version = json.loads((dir / "state.json").read_text())["version"]


def test_find_leftovers_names_each_kind_of_leftover(tmp_path):
    run, tmp, envs = tmp_path / "run", tmp_path / "tmp", tmp_path / "envs"
    (run / "checkpoints" / "v00000003").mkdir(parents=True)  # no manifest
    (run / "checkpoints" / ".v00000004.tmp-ab12").mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2')  # torn
    (run / "weights" / "versions").mkdir(parents=True)
    (run / "weights" / "versions" / "5.json.tmp-0f").write_text("{")
    (tmp / "flywheel-episodes-1-x" / "ep-y").mkdir(parents=True)
    (envs / ".build-0123-9").mkdir(parents=True)
    (envs / "0123").mkdir()  # no record
    (envs / "uv-cache").mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ, "TMPDIR": str(tmp)})  # names it
    try:
        found = find_leftovers(run, tmp_dir=tmp, env_cache=envs)
    finally:
        sleeper.kill()
        sleeper.wait()
    kinds = sorted(f.kind for f in found)
    assert kinds == [
        "checkpoint",
        "checkpoint",
        "environment",
        "environment",
        "process",
        "record",
        "store",
        "temp",
    ]
    assert not find_leftovers(tmp_path / "nothing", tmp_dir=tmp_path / "nothing", env_cache=tmp_path / "x")


def test_a_trainer_killed_while_replicating_leaves_no_half_checkpoint_on_the_peer(tmp_path):
    """The files of version 2 reached the peer, its manifest and LATEST did not; the trainer that resumes
    (from its local copy of 2) completes the peer's."""
    peer = FsspecStore(str(tmp_path / "peer"))
    ckpt = Checkpointer(tmp_path / "checkpoints", peer)
    ckpt.replicate(ckpt.save(Counter(1), {}))
    local = ckpt.save(Counter(2), {})
    peer.put("checkpoints/v00000002/trainer/state.json", (local / "trainer" / "state.json").read_bytes())
    assert [f.kind for f in checkpoints(tmp_path)] == ["checkpoint"]
    resumed = Counter(0)
    Checkpointer(tmp_path / "checkpoints", peer).restore(resumed)
    assert resumed.version == 2 and not list(checkpoints(tmp_path))
    assert json.loads(peer.get("checkpoints/LATEST")) == {"version": 2}
