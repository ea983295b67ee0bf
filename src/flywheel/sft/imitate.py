"""`flywheel sft`: the embedded base policy, a tiny transformer that imitates the noisy oracle.

1. Collect: run `scripted-noisy` through the real harness on the suite's train split, cycling the effort
   levels so the model sees every marker. The oracle's detours and mistakes make the data uneven in
   length and cost, like a real model's. Attempts are not graded (the oracle is right by construction).
2. Tokenizer: a byte-level BPE trained on the collected conversations (`flywheel.models.tiny`).
3. Model: a small Llama initialised from the seed, trained with next-token loss on the assistant's tokens
   (the action text and the `<|im_end|>` after it). The rest of the conversation is context: weight 0 by
   default, or `train.context_weight`, which also trains the model on the code and test output it reads
   (language modelling on text that repeats, e.g. a file in a `view` and again in a traceback, is how a
   model learns to copy from its context, which every edit needs). The log reports the action loss.
   `train.copy_steps` first trains the fresh model to copy: a window of conversation, then a repeat of a
   span of it, loss on the repeat (`copy_example`). Imitation alone, on ~35k action tokens, does not
   teach a model this small to copy; an edit's `old` text then comes out as the commonest line instead.

Device and precision (`[model] device`, `dtype`, as a run's `[model]`): the model trains on the device
with float32 weights and optimizer state; with `dtype = "bfloat16"` its forward passes run under
`torch.autocast` to bfloat16 and the loss is computed on float32 logits. The saved weights are float32.

The conversation is rendered exactly as the engine will render it at rollout time (the model's ChatML
template, observations clipped to the same length), so imitation and rollouts see the same text. The
result is an HF-format directory (`hf:DIR` for every command), written atomically, with
`sft_metrics.jsonl` (loss per step) and `sft_config.json` beside the weights. It is a weak policy on
purpose: it learns the shape of an attempt (run tests, view the file, edit, test, submit) and only
sometimes the right edit, which is where RL has room to work.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from flywheel.errors import FlywheelError
from flywheel.eval.run import make_specs, rollout
from flywheel.harness import HarnessConfig, efforts_for
from flywheel.models import get_model
from flywheel.models.hf import mixed, resolve_device, resolve_dtype, train_top_layers
from flywheel.models.tiny import IM_END, IM_START, build_tiny_model
from flywheel.progress import progress
from flywheel.protocols import Verdict
from flywheel.record import Trajectory, read_trajectories, write_trajectories
from flywheel.sft.rename import generic_words, rename_messages, shift_lines
from flywheel.tasks import cache_dir, load_suite


@dataclass
class SftDataConfig:
    suite: str = "toybugs"
    split: str = "train"
    episodes: int = 0  # attempts to imitate (0: one per task of the split)
    teacher: str = "scripted-noisy"
    efforts: list[str] = field(default_factory=lambda: ["medium", "high", "max"])
    observation_chars: int = 1500  # must match the runs that use the model (RolloutConfig)
    concurrency: int = 16
    rename: float = 0.0  # share of episodes whose task names are made up anew (flywheel.sft.rename)
    shift: int = 0  # most blank lines added to the module of an episode with a `cat -n` listing (shift_lines)
    copies: int = 1  # times each episode is imitated, each copy renamed and shifted on its own


@dataclass
class SftModelConfig:
    init: str = ""  # start from this model (smollm2-135m, hf:PATH) and its tokenizer; "": a new tiny model
    vocab_size: int = 1024  # the fields below shape a new tiny model only
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    max_positions: int = 2048
    max_token_chars: int = 0  # longest tokenizer token in characters (0: no limit)
    split_symbols: bool = False  # each digit and punctuation mark a token of its own (train_tokenizer)
    device: str = "auto"  # "auto" (CUDA when a GPU is visible, else the CPU), "cpu" or "cuda"
    dtype: str = "float32"  # or "bfloat16": forward passes under autocast, float32 weights and optimizer


@dataclass
class SftTrainConfig:
    epochs: float = 3.0
    lr: float = 3e-3
    batch_size: int = 8
    max_len: int = 2048  # longer conversations are cut at the end
    context_weight: float = (
        0.0  # loss weight of the tokens the model reads (tool output, task), actions weigh 1
    )
    copy_steps: int = 0  # steps of copy pretraining before imitation (0: none)
    copy_batch_size: int = 32
    warmup_steps: int = 20
    threads: int = 1  # torch intra-op threads (0: torch's default)
    train_layers: int = 0  # train only the top N decoder layers and the final norm (0: every parameter)


@dataclass
class SftConfig:
    """`flywheel sft CONFIG`: imitation data, model shape and training."""

    seed: int = 0
    data: SftDataConfig = field(default_factory=SftDataConfig)
    model: SftModelConfig = field(default_factory=SftModelConfig)
    train: SftTrainConfig = field(default_factory=SftTrainConfig)


# ------------------------------------------------------------------------------------------ the data


DATA_FORMAT = 6  # raised whenever a teacher's episodes change, so that cached ones are collected anew


def collect(cfg: SftConfig) -> list[Trajectory]:
    """Teacher trajectories on the train split (not graded), cached by the data config and seed.

    The cache (`cache_dir()/sft-data/<key>.jsonl`) is written whole or not at all, so a run killed
    during training restarts without collecting again.
    """
    data = {k: v for k, v in asdict(cfg.data).items() if k not in _AUGMENTS}  # applied after collection
    key = hashlib.sha256(json.dumps([cfg.seed, data, DATA_FORMAT], sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "sft-data" / f"{key}.jsonl"
    if path.is_file():
        return read_trajectories(path)
    records = _collect(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_trajectories(tmp, records)
    tmp.replace(path)
    return records


def _collect(cfg: SftConfig) -> list[Trajectory]:
    tasks = load_suite(cfg.data.suite, split=cfg.data.split)
    n = cfg.data.episodes or len(tasks)
    rng = random.Random(cfg.seed)
    order = [tasks[i % len(tasks)] for i in range(n)]
    rng.shuffle(order)
    efforts = efforts_for(
        cfg.data.efforts, deterministic=True
    )  # no wall-time budget: the teacher always finishes
    specs = []
    for i, task in enumerate(order):
        specs += make_specs([task], [efforts[i % len(efforts)]], 1, seed=cfg.seed + i // len(tasks))
    teacher = get_model(cfg.data.teacher, seed=cfg.seed)
    hcfg = HarnessConfig(action_format="tagged", observation_chars=cfg.data.observation_chars)

    def not_graded(task, workspace, trajectory):
        return Verdict(task.id, success=False, error="not graded (imitation data)")

    with progress("collecting imitation data", len(specs)) as advance:
        return rollout(
            teacher,
            specs,
            hcfg,
            concurrency=cfg.data.concurrency,
            grader=not_graded,
            on_record=lambda r: advance(),
        )


_AUGMENTS = ("rename", "shift", "copies")  # data keys applied to the collected episodes


def augmented(
    conversations: list[list[dict[str, Any]]], records: list[Trajectory], cfg: SftConfig
) -> list[list[dict[str, Any]]]:
    """`data.copies` copies of the conversations, each with a `data.rename` share renamed and every one
    shifted by up to `data.shift` lines (`flywheel.sft.rename`), deterministically from the seed; names
    shared by half the source modules are kept."""
    d = cfg.data
    if not d.rename and not d.shift and d.copies == 1:
        return conversations
    tasks = {t.id: t for t in load_suite(d.suite, split=d.split)}
    keep: set[str] = set()
    if d.rename:
        keep = generic_words(
            conversations, [str(tasks[r.task_id].meta.get("module", r.task_id)) for r in records]
        )
    rng, shifts = random.Random(cfg.seed + 2), random.Random(cfg.seed + 3)
    out = []
    for _ in range(d.copies):
        for conv, r in zip(conversations, records, strict=True):
            if d.rename and rng.random() < d.rename:
                conv = rename_messages(conv, tasks[r.task_id].repo, rng, keep)
            out.append(shift_lines(conv, shifts, d.shift))
    return out


def trained_harness(spec: str) -> dict[str, Any]:
    """The harness settings an `hf:PATH` base made by `flywheel sft` learned under ({} for other models).

    A base trained on observations clipped to 1,500 characters must be evaluated on the same clipping:
    the 4,000-character default shows it conversations unlike any it has seen.
    """
    info = Path(spec[3:]) / "sft_config.json" if spec.startswith("hf:") else None
    if info is None or not info.is_file():
        return {}
    data = json.loads(info.read_text())["config"]["data"]
    return {"action_format": "tagged", "observation_chars": int(data["observation_chars"])}


def messages_of(record: Trajectory) -> list[dict[str, Any]]:
    """The conversation the model saw in a tagged-format trajectory (observations come back as user turns).

    An assistant turn the harness answered with a format error stays in the context but is marked
    `learn: False`: the base should see the teacher recover from a malformed action, not learn to write one.
    """
    out: list[dict[str, Any]] = []
    for t in record.turns:
        _add_turn(out, t)
    return out


def segments_of(record: Trajectory) -> list[list[dict[str, Any]]]:
    """`messages_of`, cut where the model summarised its own context: after a model-written compaction
    the conversation restarted from the system prompt, the task and the summary, so each segment is what
    the model saw in one context (the summary turn closes the segment before the cut)."""
    segments: list[list[dict[str, Any]]] = []
    out: list[dict[str, Any]] = []
    for t in record.turns:
        if t["role"] == "tool" and t.get("name") == "compaction" and t.get("text") == "summary":
            segments.append(out)
            out = [dict(m) for m in segments[0][:2]]  # the system prompt and the task
        else:
            _add_turn(out, t)
    return [*segments, out]


def _add_turn(out: list[dict[str, Any]], t: dict[str, Any]) -> None:
    if t["role"] in ("system", "user", "assistant"):
        out.append({"role": t["role"], "content": t["text"]})
    elif t["role"] == "tool" and t.get("name") != "compaction":
        if t.get("name") == "format_error" and out and out[-1]["role"] == "assistant":
            out[-1]["learn"] = False
        out.append({"role": "user", "content": t["text"]})


def render_with_spans(messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
    """ChatML text of `messages` (the tiny model's template) and the character spans to learn.

    A span covers an assistant message's content and the `<|im_end|>` that closes it, unless the message
    is marked `learn: False`.
    """
    text, learned, _ = _render(messages)
    return text, learned


def _render(messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
    """(text, learned spans, context spans): context is what the model reads but never writes (the system
    prompt, the task, tool output)."""
    text, learned, context = "", [], []
    for m in messages:
        text += f"{IM_START}{m['role']}\n"
        start = len(text)
        text += f"{m['content']}{IM_END}"
        if m["role"] != "assistant":
            context.append((start, len(text)))
        elif m.get("learn", True):
            learned.append((start, len(text)))
        text += "\n"
    return text, learned, context


def encode(
    tokenizer, messages: list[dict[str, str]], max_len: int, context_weight: float = 0.0
) -> tuple[list[int], list[float]]:
    """Token ids of the conversation and each token's loss weight: 1 inside an assistant span to learn,
    `context_weight` inside the context, 0 elsewhere (role headers, the teacher's malformed actions)."""
    text, learned, context = _render(messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]

    def weight(s: int) -> float:
        if any(a <= s < b for a, b in learned):
            return 1.0
        return context_weight if any(a <= s < b for a, b in context) else 0.0

    return ids[:max_len], [weight(s) for s, _ in offsets][:max_len]


# ------------------------------------------------------------------------------------------ training


def batches(examples: list[tuple[list[int], list[bool]]], batch_size: int, rng: random.Random):
    """Examples grouped by length (little padding), batches in random order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(groups)
    return groups


def collate(examples: list[tuple[list[int], list[float]]], pad_id: int):
    """(ids, attention mask, loss weights) of a padded batch; padding weighs 0."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    weights = torch.zeros((len(examples), width))
    for j, (seq, w) in enumerate(examples):
        ids[j, : len(seq)] = torch.tensor(seq)
        mask[j, : len(seq)] = 1
        weights[j, : len(seq)] = torch.tensor(w)
    return ids, mask, weights


def weighted_loss(model, ids, mask, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """(objective, target loss): next-token cross-entropy averaged with `weights` over the predicted
    tokens, and the same restricted to the weight-1 tokens (the actions; what the log reports).

    The output head runs only where the weight is not 0 (for a 49k vocabulary it is the costly part). The
    batch moves to the model's device."""
    ids, mask, weights = ids.to(model.device), mask.to(model.device), weights.to(model.device)
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    w = weights[:, 1:]
    at = w > 0
    logits = model.get_output_embeddings()(hidden[at]).float()
    ce = torch.nn.functional.cross_entropy(logits, ids[:, 1:][at], reduction="none")
    w = w[at]
    target = (w == 1.0).float()
    return (ce * w).sum() / w.sum().clamp(min=1e-9), (ce * target).sum().detach() / target.sum().clamp(min=1)


def _precision(model, cfg: SftConfig):
    """The context of a training forward: autocast to `[model] dtype` on the model's device."""
    return mixed(model.device, resolve_dtype(cfg.model.dtype, "[model] dtype"))


def _trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _optimize(model, opt, objective: torch.Tensor) -> torch.Tensor:
    """One optimizer step on `objective`, gradients clipped to norm 1; returns the norm before clipping."""
    opt.zero_grad(set_to_none=True)
    objective.backward()
    norm = torch.nn.utils.clip_grad_norm_(_trainable(model), 1.0)
    opt.step()
    return norm


def lr_at(step: int, total: int, warmup: int, lr: float) -> float:
    """Linear warmup, then cosine decay to 10% of `lr`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train_model(model, tokenizer, examples, cfg: SftConfig, log) -> None:
    rng = random.Random(cfg.seed)
    per_epoch = math.ceil(len(examples) / cfg.train.batch_size)
    total = max(1, int(per_epoch * cfg.train.epochs))
    opt = torch.optim.AdamW(_trainable(model), lr=cfg.train.lr, weight_decay=0.0, betas=(0.9, 0.95))
    model.train()
    step = 0
    with progress("sft", total) as advance:
        while step < total:
            for group in batches(examples, cfg.train.batch_size, rng):
                if step >= total:
                    break
                ids, mask, weights = collate([examples[i] for i in group], tokenizer.pad_token_id)
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, total, cfg.train.warmup_steps, cfg.train.lr)
                with _precision(model, cfg):
                    objective, loss = weighted_loss(model, ids, mask, weights)
                norm = _optimize(model, opt, objective)
                step += 1
                log(
                    {
                        "step": step,
                        "loss": round(float(loss), 5),
                        "objective": round(float(objective.detach()), 5),
                        "grad_norm": round(float(norm), 4),
                    }
                )
                advance(loss=float(loss))
    model.eval()


def copy_example(stream: list[int], rng: random.Random, window: int = 200) -> tuple[list[int], list[float]]:
    """A window of real conversation tokens followed by a repeat of a span of it (8 to 40 tokens).

    Only the repeat is learned, after its first two tokens (which nothing in the window predicts): the
    one way to predict it is to find the span in the window and copy on, the skill an `<edit>` needs.
    """
    a = rng.randrange(0, max(1, len(stream) - window))
    ctx = stream[a : a + window]
    n = rng.randint(8, min(40, len(ctx) // 2))
    b = rng.randrange(0, len(ctx) - n)
    return ctx + ctx[b : b + n], [0.0] * (len(ctx) + 2) + [1.0] * (n - 2)


def pretrain_copy(model, tokenizer, streams: list[list[int]], cfg: SftConfig, log) -> None:
    """`train.copy_steps` steps of copying spans of the conversations (see `copy_example`)."""
    rng = random.Random(cfg.seed + 1)
    streams = [s for s in streams if len(s) >= 40]
    steps, t = cfg.train.copy_steps, cfg.train
    opt = torch.optim.AdamW(_trainable(model), lr=t.lr, weight_decay=0.0, betas=(0.9, 0.95))
    model.train()
    with progress("copy pretraining", steps) as advance:
        for step in range(steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, t.warmup_steps, t.lr)
            batch = [copy_example(rng.choice(streams), rng) for _ in range(t.copy_batch_size)]
            with _precision(model, cfg):
                objective, _ = weighted_loss(model, *collate(batch, tokenizer.pad_token_id))
            _optimize(model, opt, objective)
            log({"copy_step": step + 1, "copy_loss": round(float(objective.detach()), 5)})
            advance(loss=float(objective.detach()))


def _train_top(model, k: int) -> None:
    try:
        train_top_layers(model, k)
    except ValueError as e:
        raise FlywheelError(f"train.{e}") from None


def check_sft(cfg: SftConfig, out: Path) -> None:
    """Refuse an output directory in use and settings that cannot train, naming the key."""
    if out.exists() and any(out.iterdir()):
        raise FlywheelError(f"{out}: exists and is not empty; choose another --out")
    resolve_device(cfg.model.device, "[model] device")
    resolve_dtype(cfg.model.dtype, "[model] dtype")
    if not 0 <= cfg.train.context_weight < 1:
        raise FlywheelError(
            f"train.context_weight = {cfg.train.context_weight}: must be at least 0 and below 1 "
            "(the actions weigh 1)"
        )
    if not 0 <= cfg.data.rename <= 1:
        raise FlywheelError(f"data.rename = {cfg.data.rename}: must be a share between 0 and 1")
    if cfg.data.shift < 0 or cfg.data.copies < 1:
        raise FlywheelError(
            f"data.shift = {cfg.data.shift}, data.copies = {cfg.data.copies}: the shift must be "
            "0 or more and the copies 1 or more"
        )
    if not cfg.model.init and not 0 <= cfg.train.train_layers <= cfg.model.layers:
        raise FlywheelError(
            f"train.train_layers = {cfg.train.train_layers}: must be 0 (all) or at most the "
            f"model's {cfg.model.layers} layers"
        )


def new_tiny_model(cfg: SftConfig, work: Path, texts: list[str]):
    """A fresh tiny model with a tokenizer trained on `texts`, written to `work` and loaded."""
    from flywheel.models.torch_engine import load_torch_model

    m = cfg.model
    build_tiny_model(
        work,
        texts,
        vocab_size=m.vocab_size,
        hidden=m.hidden,
        layers=m.layers,
        heads=m.heads,
        max_positions=m.max_positions,
        seed=cfg.seed,
        max_token_chars=m.max_token_chars,
        split_symbols=m.split_symbols,
    )
    engine = load_torch_model(f"hf:{work}", device=cfg.model.device)
    _train_top(engine.model, cfg.train.train_layers)
    return engine


def run_sft(cfg: SftConfig, out: Path) -> Path:
    """Collect, build, train and save the base policy into `out` (which must not exist or be empty)."""
    from flywheel.models.torch_engine import load_torch_model

    out = Path(out)
    check_sft(cfg, out)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    engine = (
        load_torch_model(cfg.model.init, device=cfg.model.device) if cfg.model.init else None
    )  # first: a bad train_layers costs no work
    if engine is not None:
        _train_top(engine.model, cfg.train.train_layers)
    t0 = time.perf_counter()
    records = collect(cfg)
    pairs = [(segment, r) for r in records for segment in segments_of(r)]
    conversations = augmented([s for s, _ in pairs], [r for _, r in pairs], cfg)
    texts = [f"{m['role']}\n{m['content']}" for conv in conversations for m in conv]
    work = out.parent / f".{out.name}.building"
    shutil.rmtree(work, ignore_errors=True)
    if engine is not None:
        work.mkdir(parents=True)
        engine.tokenizer.save_pretrained(work)
    else:
        engine = new_tiny_model(cfg, work, texts)
    model, tokenizer = engine.model, engine.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    examples = [
        encode(tokenizer, conv, cfg.train.max_len, cfg.train.context_weight) for conv in conversations
    ]
    lines: list[str] = []
    torch.manual_seed(cfg.seed)
    if cfg.train.copy_steps:
        pretrain_copy(
            model, tokenizer, [ids for ids, _ in examples], cfg, lambda row: lines.append(json.dumps(row))
        )
    train_model(model, tokenizer, examples, cfg, lambda row: lines.append(json.dumps(row)))
    model.save_pretrained(work)
    (work / "sft_metrics.jsonl").write_text("\n".join(lines) + "\n")
    n_tokens = sum(len(ids) for ids, _ in examples)
    info = {
        "config": asdict(cfg),
        "episodes": len(records),
        "tokens": n_tokens,
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (work / "sft_config.json").write_text(json.dumps(info, indent=1) + "\n")
    if out.exists():
        out.rmdir()
    work.rename(out)
    return out
