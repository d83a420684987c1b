"""Pipeline stages of a model that runs its own forward (`trainers.pipeline.through_forward`): the
pieces other stages hold stand in without parameters, the kept ones keep their names, and a piece
the forward reaches where the plan does not place it is named. (Training through it on real ranks:
tests/distributed/test_library_models.py.)"""

import pytest
import torch

from library_models import LIBRARY_MODELS
from trainers.pipeline.through_forward import StandIn, check_covered, stand_in
from trainers.strategy import LayoutRefused
from zoo.plan import model_plan


def _pieces(model):
    plan = model_plan(model)
    return [*plan.pipeline.pre, *plan.block_names(model), *plan.pipeline.post]


def test_the_pieces_of_other_stages_stand_in_and_the_kept_ones_keep_their_names():
    model = LIBRARY_MODELS["gemma3"][0]()
    whole = model.state_dict()
    stand_in(model, _pieces(model), keep={"model.layers.1", "model.norm", "lm_head"})  # the last of 2 stages
    assert isinstance(model.model.layers[0], StandIn) and isinstance(model.model.embed_tokens, StandIn)
    assert model.model.layers[0].layer_idx == 0  # what a forward may read of a layer
    kept = model.state_dict()
    assert sorted(kept) == sorted(k for k in whole if k.startswith(("model.layers.1.", "model.norm.", "lm_head.")))
    assert all(torch.equal(kept[k], whole[k]) for k in kept)
    assert "model.embed_tokens" not in dict(model.named_modules())  # its patterns match nothing, as when pruned


def test_a_stand_in_reached_outside_a_stage_run_is_named():
    build, examples = LIBRARY_MODELS["llama"]
    model = build()
    stand_in(model, _pieces(model), keep={"model.layers.1", "model.norm", "lm_head"})
    with pytest.raises(RuntimeError, match=r"ran 'model.embed_tokens' outside a pipeline stage's run, but the pipeline "
                                           r"plan places it on another stage"):
        model(input_ids=examples(1)[0]["input_ids"][None])


def test_a_parameter_in_no_piece_of_the_pipeline_plan_is_refused_by_name():
    model = LIBRARY_MODELS["llama"][0]()
    model.pp_plan = {name: io for name, io in model.pp_plan.items() if name != "model.norm"}
    with pytest.raises(LayoutRefused, match=r"the parameter 'model.norm.weight' lies in none of them"):
        check_covered(model, _pieces(model))
