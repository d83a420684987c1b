"""Expert-parallel scenarios for worker.py (`experts OUT EP/ZERO[/TP[/SP[/RECOMPUTE]]] ...`): the
mixture-of-experts GPT of TP_MODELS trained 3 steps under Strategy(ep=EP, zero=ZERO, tp=TP,
sequence_parallel=SP, recompute=RECOMPUTE) on this launch's ranks, and what a test compares with
one process (tests/distributed/test_expert_parallel.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from helpers import lm_examples, tiny_gpt
from tiny_models import TP_MODELS
from trainers import Strategy, TrainConfig, Trainer
from trainers.estimate.counters import CollectiveLog
from trainers.memory.recompute import clean_fqn
from trainers.parallel.mesh import local_tensor
from zoo.nn.moe import MoEFeedForward, RoutedExperts


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def experts(out: str, *runs: str) -> None:
    """Each run "EP/ZERO[/TP[/SP[/RECOMPUTE]]]": the gradients of a probe batch (whole), then 3 steps' losses, parameters
    (whole), each step's expert counts per layer summed over the data-parallel replicas, the all-to-all payload
    bytes summed over the ranks, and each rank's local elements of the experts' parameters and of
    their AdamW moments (`expert_elements_by_rank`) beside the experts' whole count."""
    results = {}
    for run in runs:
        fields = run.split("/")
        fields += ["1", "0", "none"][len(fields) - 2:]  # the defaults of TP, SP, RECOMPUTE
        (ep, zero, tp, sequence_parallel), recompute = map(int, fields[:4]), fields[4]
        build, examples, _ = TP_MODELS["moe"]
        config = TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-3, warmup_steps=1, log_every=1,
                             progress=False, output_dir="/tmp/memzoo-test-runs", grad_clip=0.5, measure_memory=False)
        trainer = Trainer(build(), config, Strategy(zero=zero, ep=ep, tp=tp, sequence_parallel=sequence_parallel == 1,
                                                    recompute=recompute))
        trainer.model.train()  # gradients of one probe batch, the same on every rank: their mean is its gradient
        trainer.model(**default_collate(examples(4)))["loss"].backward()
        trainer.partial_gradients.sum()  # as the trainer's step does after its backward passes
        grads = {clean_fqn(name): full(param.grad) for name, param in trainer.model.named_parameters()}
        trainer.optimizer.zero_grad()
        layers = [module for module in trainer.model.modules() if isinstance(module, MoEFeedForward)]
        counts: list[torch.Tensor] = []
        for layer in layers:
            layer.register_forward_hook(lambda module, args, output: counts.append(module.expert_counts.clone()))
        with CollectiveLog() as log:
            history = trainer.fit(examples(64))
        per_step = torch.stack(counts).view(config.max_steps, -1, len(layers), layers[0].config.experts).sum(1)
        dist.all_reduce(per_step)
        per_step //= tp  # the tensor-parallel ranks of a replica route the same tokens
        sent = torch.tensor(log.bytes.get("all_to_all", 0))
        dist.all_reduce(sent)
        expert_params = [p for module in trainer.model.modules() if isinstance(module, RoutedExperts)
                         for p in module.parameters()]
        work = {id(slot.param): slot.work for slot in trainer.optimizer.slots}
        moments = [trainer.optimizer.inner.state[work[id(p)]][key] for p in expert_params
                   for key in ("exp_avg", "exp_avg_sq")]
        mine = torch.tensor([sum(local_tensor(p).numel() for p in expert_params), sum(m.numel() for m in moments)])
        by_rank = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(by_rank, mine)
        results[run] = {"losses": [r["loss"] for r in history], "params": trainer.full_state_dict(), "grads": grads,
                        "counts": per_step, "all_to_all_bytes": sent.item(),
                        "expert_elements": sum(p.numel() for p in expert_params),
                        "expert_elements_by_rank": torch.stack(by_rank).tolist(),
                        "tokens_per_step": config.global_batch_size * examples(1)[0]["input_ids"].numel(),
                        "tp": tp, "width": layers[0].config.width, "top_k": layers[0].config.top_k,
                        "experts": layers[0].config.experts, "layers": len(layers),
                        "forwards_per_rank": len(counts) // len(layers)}
    if dist.get_rank() == 0:
        torch.save(results, out)


def expert_checks(out: str) -> None:
    """The errors of expert parallelism on 2 ranks: ep=3 (not dividing the data-parallel ranks), a
    GPT of 3 experts under ep=2, a model that declares no experts under ep=2, and experts of hidden
    width 63 under tp=2."""
    config = TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=1, progress=False,
                         output_dir="/tmp/memzoo-test-runs", measure_memory=False)
    cases = {"ep3": lambda: Trainer(tiny_gpt(n_experts=4), config, Strategy(ep=3)),
             "experts3": lambda: Trainer(tiny_gpt(n_experts=3), config, Strategy(ep=2)),
             "dense": lambda: Trainer(tiny_gpt(), config, Strategy(ep=2)),
             "hidden63": lambda: Trainer(tiny_gpt(n_experts=4, moe_hidden=63), config, Strategy(tp=2))}
    errors = {}
    for name, build in cases.items():
        try:
            build()
        except ValueError as error:
            errors[name] = str(error)
    if dist.get_rank() == 0:
        torch.save(errors, out)


def _checkpoint_config(directory: str, **overrides) -> TrainConfig:
    return TrainConfig(**{**dict(global_batch_size=8, micro_batch_size=2, max_steps=4, lr=1e-3, warmup_steps=1,
                                 log_every=1, progress=False, output_dir="/tmp/memzoo-test-runs", grad_clip=0.5,
                                 measure_memory=False, checkpoint_dir=directory), **overrides})


def expert_save(directory: str, ep: str, zero: str) -> None:
    """4 steps of the mixture-of-experts GPT under Strategy(ep=EP, zero=ZERO), a checkpoint every 2;
    losses and parameters (whole) to DIR/run.pt."""
    trainer = Trainer(TP_MODELS["moe"][0](), _checkpoint_config(directory, checkpoint_every=2),
                      Strategy(zero=int(zero), ep=int(ep)))
    history = trainer.fit(lm_examples(64))
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"params": params, "losses": [r["loss"] for r in history]}, f"{directory}/run.pt")


def expert_resume(directory: str, ep: str, zero: str, out: str) -> None:
    """DIR's step-2 checkpoint resumed under Strategy(ep=EP, zero=ZERO) into a model built from
    another seed, steps 3-4 run: the loaded weights, losses and parameters (whole)."""
    trainer = Trainer(tiny_gpt(seed=123, n_experts=4, moe_top_k=2), _checkpoint_config(directory),
                      Strategy(zero=int(zero), ep=int(ep)))
    trainer.resume(f"{directory}/step_00000002")
    loaded = {name: value.clone() for name, value in trainer.full_state_dict().items()}
    history = trainer.fit(lm_examples(64))
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"loaded": loaded, "params": params, "losses": [r["loss"] for r in history]}, out)
