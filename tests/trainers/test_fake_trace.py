"""The estimator's fake model: sent without its weights, moved to the compute device as FSDP2 would move it."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import torch
from torch import nn

from trainers.estimate.fake import HostFakeMode, fake_copy, move_fake_states, without_weights
from zoo.torch_compat import FakeTensor, storage_identity


def test_fake_states_move_to_the_device_as_fresh_twins_and_ties_stay_one():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, as GPT ties its embedding and head
    model[1].bias.requires_grad_(False)
    model.register_buffer("steps", torch.zeros(3))
    mode = HostFakeMode()
    with mode:
        fake = fake_copy(model, mode)
        # The meta device stands in for a GPU here: a CPU-only torch makes no fake CUDA tensor.
        move_fake_states(fake, torch.device("meta"))
    assert {t.device.type for t in [*fake.parameters(), *fake.buffers()]} == {"meta"}
    assert fake[0].weight is fake[1].weight and len(list(fake.parameters())) == 2
    assert isinstance(fake[1].bias, nn.Parameter) and not fake[1].bias.requires_grad
    assert fake[0].weight.requires_grad and fake[0].weight.shape == (10, 4)
    assert {t.device.type for t in model.parameters()} == {"cpu"}  # the caller's model is untouched


def test_a_fake_tensor_pins_as_a_host_copy_of_the_same_bytes():
    # FSDP2 pins the parameters it offloads when training on a GPU; the budget's trace of such a
    # layout on the H200 stopped at "NYI: aten._pin_memory.default".
    with HostFakeMode():
        host = torch.empty(300, 200, dtype=torch.bfloat16)
        pinned = host.pin_memory()
    assert (pinned.shape, pinned.dtype, pinned.device) == (host.shape, host.dtype, host.device)
    assert pinned.untyped_storage().nbytes() == 300 * 200 * 2
    assert storage_identity(pinned.untyped_storage()) != storage_identity(host.untyped_storage())


def test_a_model_goes_to_the_estimating_process_without_its_weights():
    """What an estimate sends of a model: its structure, shapes and ties, not its values (a
    16 MiB model pickles to a few KiB, and no storage goes to shared memory on the way), and the fakes
    made from it stand where the weights were."""
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.LayerNorm(2048))
    model.register_buffer("scale", torch.ones(3))
    model.tied = model[0]
    assert len(pickle.dumps(without_weights(model))) < 2**14 < 4 * 2048 * 2048
    sent = pickle.loads(ForkingPickler.dumps(without_weights(model)))  # as the estimating process receives it
    assert all(p.is_meta for p in sent.parameters()) and sent.tied.weight is sent[0].weight
    mode = HostFakeMode()
    fake = fake_copy(sent, mode)
    for (name, twin), (_, param) in zip(fake.named_parameters(), model.named_parameters(), strict=True):
        assert isinstance(twin, FakeTensor) and twin.device == param.device and twin.shape == param.shape, name
        assert twin.requires_grad == param.requires_grad
    assert isinstance(fake.scale, FakeTensor) and fake.scale.device.type == "cpu"
