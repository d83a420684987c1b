"""zoo.nn.moe: the mixture-of-experts feed-forward against a float64 token-by-token reference
(outputs, every gradient, the auxiliary loss), dropless dispatch, shared experts and its errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.nn.moe import MoEConfig, MoEFeedForward
from zoo.parity import relative_error


def reference(layer: MoEFeedForward, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    """The layer's output and auxiliary loss computed one token and one expert at a time in float64,
    with the float64 leaves (parameters by name, tokens) their gradients land on."""
    config = layer.config
    params = {name: value.detach().double().requires_grad_() for name, value in layer.named_parameters()}
    tokens = x.detach().double().reshape(-1, config.width).requires_grad_()
    logits = tokens @ params["router.weight"].t()
    scores = logits.softmax(-1) if config.router == "softmax" else logits.sigmoid()
    rows, counts = [], torch.zeros(config.experts, dtype=torch.float64)
    for t in range(tokens.shape[0]):
        weights, chosen = scores[t].topk(config.top_k)
        if config.normalize_top_k:
            weights = weights / weights.sum()
        row = tokens.new_zeros(config.width)
        for weight, e in zip(weights, chosen.tolist()):
            hidden = F.silu(params["experts.gate"][e] @ tokens[t]) * (params["experts.up"][e] @ tokens[t])
            row = row + weight * (params["experts.down"][e] @ hidden)
            counts[e] += 1
        if config.shared_experts:
            shared = F.silu(params["shared.gate.weight"] @ tokens[t]) * (params["shared.up.weight"] @ tokens[t])
            row = row + params["shared.down.weight"] @ shared
        rows.append(row)
    balance = config.experts * ((counts / counts.sum()) * (scores / scores.sum(-1, keepdim=True)).mean(0)).sum()
    z = logits.logsumexp(-1).square().mean()
    aux = config.balance_weight * balance + config.z_weight * z
    return torch.stack(rows).reshape(x.shape), aux, params, tokens


@pytest.mark.parametrize("config", [
    MoEConfig(width=16, hidden=24, experts=4, top_k=2, z_weight=1e-3),
    MoEConfig(width=16, hidden=24, experts=6, top_k=1, normalize_top_k=False),
    MoEConfig(width=16, hidden=24, experts=8, top_k=3, shared_experts=2, router="sigmoid", z_weight=1e-3),
], ids=["softmax-top2", "switch-top1", "sigmoid-top3-shared"])
def test_the_layer_matches_a_token_by_token_float64_reference(config):
    torch.manual_seed(0)
    layer = MoEFeedForward(config)
    x = torch.randn(3, 7, 16, requires_grad=True)
    y, aux = layer(x)
    expected, expected_aux, params, tokens = reference(layer, x)
    assert relative_error(y, expected) < 1e-6 and abs(aux.item() - expected_aux.item()) < 1e-6 * max(expected_aux.item(), 1e-3)
    probe = torch.randn_like(y)
    ((y * probe).sum() + aux).backward()
    ((expected * probe.double()).sum() + expected_aux).backward()
    assert relative_error(x.grad, tokens.grad.reshape(x.shape)) < 1e-5
    for name, value in layer.named_parameters():
        assert relative_error(value.grad, params[name].grad) < 1e-5, name
    assert int(layer.expert_counts.sum()) == 21 * config.top_k  # dropless: every token to k experts


def test_no_token_is_dropped_when_every_token_chooses_one_expert():
    """A router that sends all 64 tokens to expert 0 first: expert 0 takes all 64, no capacity limit."""
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=8, hidden=8, experts=4, top_k=2, balance_weight=0.0))
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 10.0
    x = torch.rand(64, 8) + 0.1
    y, aux = layer(x)
    expected, *_ = reference(layer, x)
    assert layer.expert_counts[0] == 64 and int(layer.expert_counts.sum()) == 128
    assert relative_error(y, expected) < 1e-6 and aux.item() == 0.0


def test_an_expert_no_token_chose_gets_a_zero_gradient():
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=8, hidden=8, experts=4, top_k=1))
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[1] = 10.0
    layer(torch.rand(5, 8) + 0.1)[0].sum().backward()
    assert layer.expert_counts.tolist() == [0, 5, 0, 0]
    gate = layer.experts.gate
    assert gate.grad is not None and not gate.grad[0].any() and gate.grad[1].any()


@pytest.mark.parametrize(("fields", "message"), [
    (dict(top_k=5), r"MoEConfig.top_k must be between 1 and experts=4; got 5"),
    (dict(top_k=0), r"MoEConfig.top_k must be between 1 and experts=4; got 0"),
    (dict(router="relu"), r"MoEConfig.router must be 'softmax' or 'sigmoid'; got 'relu'"),
    (dict(shared_experts=-1), r"MoEConfig.shared_experts must be >= 0; got -1"),
    (dict(balance_weight=-0.1), r"MoEConfig.balance_weight must be >= 0; got -0.1"),
])
def test_bad_configurations_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(**{**dict(width=8, hidden=8, experts=4), **fields})


def test_an_input_of_another_width_is_refused():
    with pytest.raises(ValueError, match=r"MoEFeedForward expects inputs of width 8; got shape \(2, 5\)"):
        MoEFeedForward(MoEConfig(width=8, hidden=8, experts=4))(torch.randn(2, 5))


def test_a_routed_token_keeps_about_what_a_token_of_the_dense_fused_feed_forward_keeps():
    """1,024 tokens of width 64 to 2 of 8 experts of hidden width 256, beside the dense fused
    feed-forward of the same width: per routed token the layer keeps the gate pre-activation (256
    floats) and a few numbers of routing, within 10% of the dense layer's per token."""
    from trainers.memory.saved_activations import SavedActivations
    from zoo.nn import FusedMLP

    torch.manual_seed(0)
    x = torch.randn(1024, 64, requires_grad=True)
    kept = {}
    for name, layer, assignments in (("dense", FusedMLP(64, 256, activation="silu"), 1024),
                                     ("moe", MoEFeedForward(MoEConfig(width=64, hidden=256, experts=8, top_k=2)), 2048)):
        with SavedActivations(exclude=[x, *layer.parameters()]) as saved:
            layer(x)
        kept[name] = saved.bytes / assignments
    assert kept["dense"] == 4 * 256
    assert kept["moe"] <= 1.1 * kept["dense"], kept


def test_shapes_the_grouped_product_refuses_run_one_product_an_expert_and_say_so(caplog):
    """Width 6 (rows of 24 bytes, not 16-byte aligned): torch's grouped product refuses; the layer
    loops over the experts, logs that once, and still matches the reference."""
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=6, hidden=8, experts=3, top_k=2))
    x = torch.randn(10, 6, requires_grad=True)
    with caplog.at_level("WARNING", logger="zoo.nn"):
        y, aux = layer(x)
        layer(x)
    expected, *_ = reference(layer, x)
    assert relative_error(y, expected) < 1e-6
    refusals = [record for record in caplog.records if "grouped product refused" in record.getMessage()]
    assert refusals and len({record.getMessage() for record in refusals}) == len(refusals)  # each said once


def test_aligned_shapes_take_the_grouped_product_without_a_word(caplog):
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=16, hidden=24, experts=4, top_k=2))
    with caplog.at_level("WARNING", logger="zoo.nn"):
        y, aux = layer(torch.randn(5, 16, requires_grad=True))
        (y.sum() + aux).backward()
    assert "grouped product refused" not in caplog.text


def test_the_grouped_product_is_decided_once_per_kind_of_operands(monkeypatch, caplog):
    """A refusal of the operands turns that kind to one product an expert, said once and not tried
    again; any other error (out of memory) is raised, never taken for a refusal."""
    import zoo.nn.moe as moe

    calls = []

    def refusing(a, b, offs):
        calls.append(a.shape)
        raise RuntimeError("strides should be multiple of 16 bytes")

    monkeypatch.setattr(moe, "grouped_mm", refusing)
    monkeypatch.setattr(moe, "_grouped_refused", set())
    torch.manual_seed(0)
    layer = MoEFeedForward(MoEConfig(width=16, hidden=24, experts=4, top_k=2))
    x = torch.randn(10, 16, requires_grad=True)
    with caplog.at_level("WARNING", logger="zoo.nn"):
        for _ in range(3):
            y, _aux = layer(x)
    assert relative_error(y, reference(layer, x)[0]) < 1e-6
    tried = len(calls)
    assert tried == len(moe._grouped_refused) <= 2  # the forward's two kinds of operands, each tried once
    assert len([r for r in caplog.records if "grouped product refused" in r.getMessage()]) == tried

    def out_of_memory(a, b, offs):
        raise torch.OutOfMemoryError("out of memory: tried to allocate 2.00 GiB")

    monkeypatch.setattr(moe, "grouped_mm", out_of_memory)
    monkeypatch.setattr(moe, "_grouped_refused", set())
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate"):
        layer(x)
    monkeypatch.setattr(moe, "grouped_mm", lambda a, b, offs: (_ for _ in ()).throw(RuntimeError("CUBLAS_STATUS_ERROR")))
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_ERROR"):
        layer(x)


def test_an_empty_batch_gives_a_zero_auxiliary_loss_and_gradients():
    layer = MoEFeedForward(MoEConfig(width=16, hidden=24, experts=4, top_k=2, z_weight=1e-3))
    x = torch.randn(0, 16, requires_grad=True)
    y, aux = layer(x)
    assert y.shape == (0, 16) and aux.item() == 0.0
    (y.sum() + aux).backward()
    assert all(torch.isfinite(p.grad).all() and not p.grad.any() for p in layer.parameters() if p.grad is not None)
