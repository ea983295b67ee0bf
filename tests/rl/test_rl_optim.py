"""Muon + AdamW: where each parameter goes, that a step moves weights, and checkpoint round trips."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from flywheel.rl import CompositeOptimizer, build_optimizer, split_parameters

VOCAB, HIDDEN = 32, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(HIDDEN)
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, 2 * HIDDEN)  # with a bias
        self.down_proj = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)
        self.post_norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + torch.tanh(self.q_proj(h))
        return self.post_norm(x + self.down_proj(torch.relu(self.up_proj(x))))


class TinyLM(nn.Module):
    """A Llama-shaped model; ``head`` picks a tied head, a separate ``lm_head``, or one found only
    through ``get_output_embeddings`` (named ``out``)."""

    def __init__(self, head: str = "tied") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.RMSNorm(HIDDEN)
        self.head_kind = head
        if head == "tied":
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
            self.lm_head.weight = self.embed_tokens.weight
        elif head == "lm_head":
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        else:
            self.out = nn.Linear(HIDDEN, VOCAB, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.out if self.head_kind == "out" else self.lm_head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.get_output_embeddings()(self.norm(x))


def make_model(head: str = "tied", seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(head)


def train_step(model: nn.Module, opt: CompositeOptimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 6), generator=gen)
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


HIDDEN_MATRICES = {f"layers.{i}.{n}.weight" for i in (0, 1) for n in ("q_proj", "up_proj", "down_proj")}


@pytest.mark.parametrize("head", ["tied", "lm_head", "out"])
def test_every_parameter_lands_in_exactly_one_group(head):
    model = make_model(head)
    groups = split_parameters(model)
    ids = [id(p) for members in groups.values() for _, p in members]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("head", ["tied", "lm_head", "out"])
def test_muon_gets_exactly_the_hidden_matrices(head):
    model = make_model(head)
    groups = split_parameters(model)
    assert {n for n, _ in groups["muon"]} == HIDDEN_MATRICES
    never = {id(model.embed_tokens.weight), id(model.get_output_embeddings().weight)}
    never |= {
        id(p) for m in model.modules() if isinstance(m, (nn.RMSNorm, nn.LayerNorm)) for p in m.parameters()
    }
    assert not never & {id(p) for _, p in groups["muon"]}


def test_norms_and_biases_are_not_decayed_embeddings_and_head_are():
    groups = split_parameters(make_model("lm_head"))
    no_decay = {n for n, _ in groups["adamw_no_decay"]}
    assert "norm.weight" in no_decay and "layers.0.up_proj.bias" in no_decay
    assert "layers.1.post_norm.bias" in no_decay
    assert {n for n, _ in groups["adamw"]} == {"embed_tokens.weight", "lm_head.weight"}


def test_frozen_parameters_are_left_out():
    model = make_model()
    model.layers[0].q_proj.weight.requires_grad_(False)
    names = {n for members in split_parameters(model).values() for n, _ in members}
    assert "layers.0.q_proj.weight" not in names


def test_adamw_kind_puts_hidden_matrices_in_adamw():
    groups = split_parameters(make_model(), kind="adamw")
    assert groups["muon"] == []
    assert {n for n, _ in groups["adamw"]} >= HIDDEN_MATRICES
    opt = build_optimizer(make_model(), kind="adamw", lr=1e-3)
    assert list(opt.optimizers) == ["adamw"]


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown optimizer kind"):
        build_optimizer(make_model(), kind="sgd")  # type: ignore[arg-type]


def test_muon_build_uses_torch_muon_and_adamw_with_given_rates():
    opt = build_optimizer(make_model(), lr=1e-3, muon_lr=2e-2, weight_decay=0.1)
    assert isinstance(opt.optimizers["muon"], torch.optim.Muon)
    assert isinstance(opt.optimizers["adamw"], torch.optim.AdamW)
    assert opt.optimizers["muon"].param_groups[0]["lr"] == 2e-2
    decays = sorted(g["weight_decay"] for g in opt.optimizers["adamw"].param_groups)
    assert decays == [0.0, 0.1]
    assert len(opt.param_groups) == 3


def test_a_step_changes_every_weight():
    model = make_model("lm_head")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=1e-2)
    train_step(model, opt, seed=1)
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    assert opt.optimizers["muon"].state and opt.optimizers["adamw"].state


def test_zero_grad_clears_gradients():
    model = make_model()
    opt = build_optimizer(model, lr=1e-2)
    train_step(model, opt, seed=1)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_step_with_closure_returns_its_loss():
    model = make_model()
    opt = build_optimizer(model, lr=1e-2)
    ids = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(ids).logsumexp(-1).mean()
        loss.backward()
        return loss

    assert torch.is_tensor(opt.step(closure))


def test_state_dict_round_trip_resumes_identically():
    model = make_model()
    opt = build_optimizer(model, lr=1e-2)
    for seed in range(2):
        train_step(model, opt, seed)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    resumed = make_model(seed=123)
    resumed.load_state_dict(saved["model"])
    resumed_opt = build_optimizer(resumed, lr=1e-2)
    resumed_opt.load_state_dict(saved["optim"])
    for seed in (7, 8):
        train_step(model, opt, seed)
        train_step(resumed, resumed_opt, seed)
    for (name, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_state_dict_for_another_layout_is_refused():
    opt = build_optimizer(make_model(), lr=1e-2)
    with pytest.raises(ValueError, match="expected"):
        opt.load_state_dict({"adamw": opt.state_dict()["adamw"]})


def test_model_without_hidden_matrices_gets_adamw_only():
    opt = build_optimizer(nn.Sequential(nn.Embedding(8, 4), nn.LayerNorm(4)), lr=1e-2)
    assert list(opt.optimizers) == ["adamw"]


@pytest.mark.slow
def test_tiny_llama_from_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    groups = split_parameters(model)
    muon = {n for n, _ in groups["muon"]}
    assert "model.embed_tokens.weight" not in muon and all("norm" not in n for n in muon)
    assert len(muon) == 7  # q, k, v, o, gate, up, down
    ids = [id(p) for members in groups.values() for _, p in members]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())


def test_train_top_layers_freezes_everything_below_them():
    from flywheel.models.hf import train_top_layers

    model = make_model("tied")
    n = train_top_layers(model, 1)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        name for name, _ in model.named_parameters() if name.startswith(("layers.1.", "norm."))
    }
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_step(model, build_optimizer(model, "muon", lr=1e-2), seed=0)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(k.startswith(("layers.1.", "norm.")) for k in moved), moved
    assert train_top_layers(model, 0) == sum(p.numel() for p in model.parameters())  # 0: all of them


@pytest.mark.parametrize("k", [-1, 3])
def test_train_top_layers_refuses_a_count_the_model_does_not_have(k):
    from flywheel.models.hf import train_top_layers

    with pytest.raises(ValueError, match=f"train_layers = {k}"):
        train_top_layers(make_model(), k)
