"""The plans a model's library ships (transformers' `tp_plan` and `pp_plan`) as `ModelPlan`s: what
each family's plan becomes, what is kept whole and why, what is refused by name, and the estimator
tracing such a model under its plan."""

import pytest
import torch
from torch import nn

from library_models import LIBRARY_MODELS
from trainers import Strategy, estimate_layouts
from trainers.estimate.fake import without_weights
from trainers.parallel.tensor import check_plan
from trainers.strategy import LayoutRefused
from zoo.plan import ModelPlan, PipelineSplit, model_plan

ATTENTION = ("q_proj", "k_proj", "v_proj")


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_a_decoder_plan_splits_attention_and_feed_forward(family):
    model = LIBRARY_MODELS[family][0]()
    plan = model_plan(model)
    assert plan.block_names(model) == ["model.layers.0", "model.layers.1"]
    assert plan.colwise == (*(f"model.layers.*.self_attn.{p}" for p in ATTENTION), "model.layers.*.mlp.gate_proj",
                            "model.layers.*.mlp.up_proj")
    assert plan.rowwise == ("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj")
    assert plan.colwise_gathered == ("lm_head",) and plan.vocab_parallel == ("model.embed_tokens",)
    assert plan.regions == ("model.layers.*.self_attn", "model.layers.*.mlp")
    assert plan.sequence_split_input == ("model.layers.0",) and plan.sequence_gather == ("model.norm",)
    assert plan.sequence_parallel == ("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm",
                                      "model.norm")
    assert plan.heads == tuple((f"model.layers.*.self_attn.{p}", 8) for p in ATTENTION)
    norms = ("model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm")
    assert plan.replicated == (norms if family == "qwen3" else ())
    names = check_plan(model, plan, 2, False)
    assert names["colwise_gathered"] == ["lm_head"]
    with pytest.raises(LayoutRefused, match=r"Strategy.tp=4 must divide the 2 heads of 'model.layers.0.self_attn.k_proj'"):
        check_plan(model, plan, 4, False)  # 2 key/value heads


def test_a_tied_embedding_and_head_stay_whole_together():
    model = LIBRARY_MODELS["gemma3"][0]()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    plan = model_plan(model)
    assert plan.colwise_gathered == () and plan.vocab_parallel == ()
    assert [pattern for pattern, _ in plan.kept_whole] == ["lm_head", "model.embed_tokens"]
    assert all("tied" in why for _, why in plan.kept_whole)
    assert plan.replicated == ("model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm")
    assert plan.sequence_parallel == tuple(f"model.layers.*.{norm}_layernorm" for norm in (
        "input", "post_attention", "pre_feedforward", "post_feedforward")) + ("model.norm",)
    check_plan(model, plan, 2, True)


def test_an_embedding_with_a_padding_row_stays_whole():
    model = LIBRARY_MODELS["llama"][0]()
    model.model.embed_tokens.padding_idx = 0
    plan = model_plan(model)
    assert plan.vocab_parallel == () and plan.colwise_gathered == ("lm_head",)
    assert plan.kept_whole == (("model.embed_tokens", "it has a padding row, whose zero gradient a vocabulary split "
                                                      "would misplace"),)


@pytest.mark.parametrize("family, pre, post", [
    ("llama", ("model.embed_tokens",), ("model.norm", "lm_head")),
    ("gemma3", ("model.embed_tokens",), ("model.norm", "lm_head")),
    ("neox", ("gpt_neox.embed_in", "gpt_neox.emb_dropout"), ("gpt_neox.final_layer_norm", "lm_head"))])
def test_a_decoder_cuts_into_stages_where_its_pipeline_plan_says(family, pre, post):
    """The base model's pipeline plan in its order around the layers, then the class's own head."""
    assert model_plan(LIBRARY_MODELS[family][0]()).pipeline == PipelineSplit(pre=pre, post=post, through_forward=True)


def test_encoders_without_a_tensor_parallel_plan_still_have_blocks():
    for family, blocks in (("bert", ["bert.encoder.layer.0", "bert.encoder.layer.1"]), ("vit", ["vit.layers.0", "vit.layers.1"])):
        model = LIBRARY_MODELS[family][0]()
        plan = model_plan(model)
        assert plan.block_names(model) == blocks
        assert not plan.tensor_parallel
        assert plan.pipeline is None  # transformers ships no pipeline plan for either
        with pytest.raises(LayoutRefused, match=r"nor does its library ship one \(transformers' tp_plan\)"):
            check_plan(model, plan, 2, False)


def test_a_style_memzoo_does_not_apply_is_refused_under_tensor_parallelism_only():
    model = LIBRARY_MODELS["neox"][0]()
    model.tp_plan = {**model.tp_plan, "gpt_neox.layers.*.attention.query_key_value": "packed_colwise"}
    plan = model_plan(model)
    assert plan.block_names(model) == ["gpt_neox.layers.0", "gpt_neox.layers.1"]  # ZeRO and recompute still serve
    with pytest.raises(LayoutRefused, match=r"Strategy.tp=2 cannot split GPTNeoXForCausalLM: "
                                            r"'gpt_neox.layers.\*.attention.query_key_value' is 'packed_colwise' in "
                                            r"GPTNeoXForCausalLM's tensor-parallel plan: its weight packs several "
                                            r"projections along the output"):
        check_plan(model, plan, 2, False)


def test_a_declared_plan_wins_over_the_library_plan():
    model = LIBRARY_MODELS["llama"][0]()
    model.parallel_plan = lambda: ModelPlan(blocks=("model.layers.*",))
    assert model_plan(model) == ModelPlan(blocks=("model.layers.*",))


def test_a_module_of_no_library_has_no_plan():
    assert model_plan(nn.Sequential(nn.Linear(2, 2))) == ModelPlan()


def test_the_library_model_computes_its_loss_as_transformers_does():
    """The Trainer reads `loss` from transformers' output, with labels unshifted (the model shifts)."""
    model = LIBRARY_MODELS["llama"][0]()
    batch = {key: torch.stack([e[key] for e in LIBRARY_MODELS["llama"][1](2)]) for key in ("input_ids", "labels")}
    output = model(**batch)
    logits = output["logits"]
    expected = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())
    assert output["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_estimator_traces_a_library_model_under_its_own_plans():
    """`estimate_layouts` accepts a transformers model as it is. Under tp=2 Gemma 3's parameters per
    rank are those of one process less half of every split layer's (`zoo.library_plan`; its tied
    embedding and head stay whole). Under pp=2 each stage runs through the model's own forward: the
    first holds the embedding and the first layer, the last the second layer, the final norm and the
    head, whose weight is the embedding's (a copy on each stage)."""
    build, examples = LIBRARY_MODELS["gemma3"]
    model = build()
    batch = {key: torch.stack([e[key] for e in examples(2)]) for key in ("input_ids", "labels")}
    whole, split, staged = estimate_layouts(model, batch, [(Strategy(), 1, None), (Strategy(tp=2), 2, None),
                                                           (Strategy(pp=2), 2, None)])
    names = check_plan(model, model_plan(model), 2, False)
    modules = dict(model.named_modules())
    halved = sum(p.numel() for field in ("colwise", "rowwise", "colwise_gathered", "vocab_parallel")
                 for name in names[field] for local, p in modules[name].named_parameters()
                 if not (field == "rowwise" and local == "bias"))
    total = sum(p.numel() for p in model.parameters())
    assert halved > total // 2  # the split layers hold most of the model
    assert split.at_peak()["parameters"] * total == whole.at_peak()["parameters"] * (total - halved // 2)
    size = lambda *names: 4 * sum(p.numel() for n in names for p in model.get_submodule(n).parameters())  # noqa: E731
    assert [rank.parameters for rank in staged.ranks] == [size("model.embed_tokens", "model.layers.0"),
                                                          size("model.layers.1", "model.norm", "lm_head")]


def test_the_estimator_keeps_the_positions_a_library_model_indexes_by():
    """BERT indexes its token types by its `position_ids` buffer: the estimator's weightless copy keeps
    such small integer buffers (an arbitrary-valued twin made it gather out of bounds) and traces it."""
    build, examples = LIBRARY_MODELS["bert"]
    model = build()
    copy = without_weights(model)
    assert torch.equal(copy.bert.embeddings.position_ids, model.bert.embeddings.position_ids)
    assert copy.bert.embeddings.word_embeddings.weight.is_meta
    batch = {key: torch.stack([e[key] for e in examples(2)]) for key in examples(2)[0]}
    (estimate,) = estimate_layouts(model, batch, [(Strategy(), 1, None)])
    assert estimate.ranks[0].parameters == 4 * sum(p.numel() for p in model.parameters())
