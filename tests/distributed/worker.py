"""Multi-process scenarios, run by the tests under torchrun. Each writes its results (full
tensors gathered on rank 0) to a file the test compares. One launch runs several commands
separated by "+" (`worker.py tp_save DIR + tp_activations OUT`), one after another.

    worker.py strategies OUT [zero:offload ...]   train each strategy 3 steps; params + grads
    worker.py scalars OUT [zero:precision ...]     a model with 0-dim parameters 3 steps per stage: params, losses
    worker.py routed OUT DIR MODE                   a model whose micro batches choose the head they train, 3 steps
                                                   in memory or with its states in chunks: each rank's params, chunks
    worker.py save DIR ZERO                        train 2 steps, checkpoint, dump full state
    worker.py load DIR ZERO OUT                    load DIR at stage ZERO, dump full state
    worker.py unreadable DIR OUT                   resume DIR while rank 0 cannot read a file: each rank's error
    worker.py memory OUT ZERO                      memory report of a fp32 run
    worker.py evaluate OUT                         ZeRO-3 evaluation of 3 micro batches
    worker.py transducer OUT LOSS ZERO ...         train the tiny transducer 3 steps per stage
    worker.py dropout OUT                          train with dropout 0.5 (ZeRO-2): params + losses
    worker.py chunks OUT DIR MODEL MODE ...        GPT or the Conformer transducer 3 steps in memory, in chunks
                                                   on disk, ZeRO-3 over chunks (+ activations swapped): params,
                                                   losses, disk bytes
    worker.py chunks_checkpoint DIR OUT            ZeRO-3 over chunks and FSDP ZeRO-3 checkpoints, each resumed
                                                   by the other and by itself: losses + params
    worker.py tensor_parallel OUT MODEL/TP/ZERO/SP[/compiled] ...  each model and layout (its blocks
                                                   compiled with /compiled): gradients on a probe
                                                   batch, then 3 training steps: losses, params
    worker.py tp_save DIR                          4 steps at dp=2 x tp=2 ZeRO-3, checkpoint every 2: losses + params
    worker.py tp_resume DIR TP ZERO OUT            resume DIR's step-2 checkpoint, run steps 3-4: losses + params
    worker.py tp_activations OUT                   saved bytes of GPT's first block under tp = world (and + SP)
    worker.py experts OUT EP/ZERO ...              the mixture-of-experts GPT 3 steps under expert parallelism
                                                   (tests/distributed/expert_scenarios.py)
    worker.py expert_checks OUT                    the errors of expert parallelism on 2 ranks
    worker.py expert_save DIR EP ZERO              4 steps under expert parallelism, checkpoint every 2
    worker.py expert_resume DIR EP ZERO OUT        resume DIR's step-2 checkpoint, run steps 3-4
    worker.py library OUT FAMILY/STRATEGY ...      transformers' models under a strategy, 3 steps: losses,
                                                   params, or the refusal (tests/distributed/library_scenarios.py)
    worker.py budget OUT LAYOUT ...                training under a memory budget (budget_worker.py)
    worker.py tp_checks OUT                        tp=2: random draws inside and outside a region; the
                                                   errors of a sequence that sequence parallelism cannot
                                                   split and of 15 residues axial parallelism cannot;
                                                   a GPT built on the meta device; the vocabulary-
                                                   parallel fused cross-entropy against float64
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

# The repository root first (tests/ mirrors its package names), then tests/ for the helpers.
sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
sys.path += [str(Path(__file__).resolve().parents[1])]

from asr.data import collate_speech  # noqa: E402
from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains  # noqa: E402
from helpers import chunk_budget, lm_examples, run_commands, tiny_gpt  # noqa: E402
from tiny_transducer import tiny, token_utterances  # noqa: E402
from tiny_models import TP_MODELS, speech_examples, tiny_fold  # noqa: E402
from trainers import Strategy, TrainConfig, Trainer  # noqa: E402
from trainers.speed.compile import compiled_forwards  # noqa: E402
from trainers.parallel.mesh import exit_process, shutdown_distributed  # noqa: E402
from trainers.memory.recompute import clean_fqn  # noqa: E402
from expert_scenarios import expert_checks, expert_resume, expert_save, experts  # noqa: E402
from library_scenarios import library  # noqa: E402
from budget_worker import main as budget  # noqa: E402
from parity_models import GainedRegression, Routed  # noqa: E402
from zoo.plan import ModelPlan  # noqa: E402

STEPS = 3


def config(**overrides) -> TrainConfig:
    """A few steps of parity: no memory measurement unless asked (it doubles a step's time)."""
    base = dict(global_batch_size=8, micro_batch_size=2, max_steps=STEPS, lr=1e-2, warmup_steps=1,
                log_every=1, progress=False, output_dir="/tmp/memzoo-test-runs", grad_clip=0.5, measure_memory=False)
    return TrainConfig(**{**base, **overrides})


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().cpu().clone()


def gradients_on_probe_batch(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Gradients of the loss of 4 fixed examples at the trained parameters: rank r of W uses
    examples r*4/W ... (r+1)*4/W, so the reduced gradient is the mean over all four."""
    examples = lm_examples(4, seed=99)
    world, rank = dist.get_world_size(), dist.get_rank()
    share = 4 // world
    batch = {k: torch.stack([e[k] for e in examples[rank * share : (rank + 1) * share]]) for k in examples[0]}
    trainer.model(**batch)["loss"].backward()
    return {clean_fqn(n): full(p.grad) for n, p in trainer.model.named_parameters()}


def strategies(out: str, *combos: str) -> None:
    """Every parameter of the blocks is pulled back toward an anchor (TrainConfig.anchor_decay): the
    first block's toward another initialisation's weights, each rank keeping its own piece of them,
    the others' toward where they started."""
    other = dict(tiny_gpt(seed=7).named_parameters())
    anchor = {name: value.detach() for name, value in other.items() if name.startswith("blocks.0.")}
    results = {}
    for combo in combos:
        zero, offload = combo.split(":")
        trainer = Trainer(tiny_gpt(), config(anchor_decay={"blocks.": 5.0}), Strategy(zero=int(zero), offload=offload),
                          anchor=anchor)
        history = trainer.fit(lm_examples(64))
        params = {k: v.clone() for k, v in trainer.full_state_dict().items()}
        results[combo] = {"params": params, "grads": gradients_on_probe_batch(trainer),
                          "losses": [r["loss"] for r in history]}
    if dist.get_rank() == 0:
        torch.save(results, out)


def scalars(out: str, *combos: str) -> None:
    generator = torch.Generator().manual_seed(3)
    xs = torch.randn(64, 4, generator=generator)
    data = [{"x": x, "y": torch.sin(x).sum()} for x in xs]
    results = {}
    for combo in combos:
        zero, precision = combo.split(":")
        trainer = Trainer(GainedRegression(), config(), Strategy(zero=int(zero), precision=precision))
        history = trainer.fit(data)
        results[combo] = {"params": {k: v.clone() for k, v in trainer.full_state_dict().items()},
                          "losses": [r["loss"] for r in history]}
    if dist.get_rank() == 0:
        torch.save(results, out)


def routed(out: str, directory: str, mode: str) -> None:
    generator = torch.Generator().manual_seed(5)
    data = [{"x": x, "y": x.sum().tanh()} for x in torch.randn(64, 8, generator=generator)]
    strategy = (Strategy(offload="chunks", offload_dir=f"{directory}/{mode}", memory_budget=chunk_budget(256 * 2**20))
                if mode == "chunks" else None)
    trainer = Trainer(Routed(), config(micro_batch_size=1), strategy)
    history = trainer.fit(data)
    local = trainer.full_state_dict() if strategy is None else trainer.chunks.state_dict(trainer.model)
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, {name: value.clone() for name, value in local.items()})
    if dist.get_rank() == 0:
        chunk_of = ({member.name: member.chunk for member in trainer.chunks.members} if strategy is not None else {})
        torch.save({"params": states, "losses": [r["loss"] for r in history], "chunk_of": chunk_of}, out)


CHUNK_MODELS = {
    "gpt": (lambda: tiny_gpt(n_embd=128, n_layer=4, vocab_size=512, block_size=32, dropout=0.1),
            lambda: lm_examples(64, length=32, vocab=512), None, 1e-3, 8 * 2**20, 8 * 2**20),
    "conformer": (lambda: tiny(loss="samplewise_pruned", warm_steps=2, prune_range=3, samplewise_memory_budget=1),
                  lambda: speech_examples(16), collate_speech, 3e-3, 4 * 2**20, 2 * 2**20),
}
"""Models of the chunked runs: factory, examples, collate, learning rate, room for chunks in host
memory, and the device budget of a device tier (bytes; too small for a rank's states beside the step's tensors)."""


def chunks(out: str, directory: str, model: str, *modes: str) -> None:
    """`model` 3 steps in memory ("memory"), with its states in chunks with room for a few of them
    beside what the process held before ("chunks"; after "memory", whose run grew the process to its
    size in training), or the same with ZeRO-3 over the chunks ("zero3"), and with saved activations
    of 16 KiB and more swapped to disk ("zero3-swap"), and "chunks" or "zero3" with a device tier
    ("chunks-device", "zero3-device"; host memory standing for the device; 4 times the room in
    host memory):
    parameters, losses, bytes read from the chunk files each step, the bytes of each rank's chunk
    files after training, the room, and under a device tier the bytes copied up and down and the
    chunks updated on the device each step; "zero3-plan": ZeRO-3 over chunks with no room for kept
    activations, so that every block swaps or recomputes (the choice made on rank 0 for all)."""
    build, examples, collate, lr, room, device_room = CHUNK_MODELS[model]
    results = {}
    for mode in modes:
        host_room = 4 * room if mode.endswith("device") else room  # the device tier is tight instead
        strategy = (Strategy(offload="chunks", offload_dir=f"{directory}/{mode}", memory_budget=chunk_budget(host_room),
                             zero=3 if mode.startswith("zero3") else 0,
                             swap_activations=16 * 2**10 if mode.endswith("swap") else None,
                             device_memory_budget=device_room if mode.endswith("device") else None,
                             activation_memory=1 if mode.endswith("plan") else None)
                    if mode != "memory" else None)
        trainer = Trainer(build(), config(max_steps=3, lr=lr), strategy)
        history = trainer.fit(examples(), collate_fn=collate)
        on_disk = sum(f.stat().st_size for f in Path(f"{directory}/{mode}").rglob("*.bin")) if strategy else 0
        disk = [0] * dist.get_world_size()
        dist.all_gather_object(disk, on_disk)
        folders = sorted(p.name for p in Path(f"{directory}/{mode}").iterdir()) if strategy else []
        results[mode] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history],
                         "read": [r.get("offload_read_bytes", 0) for r in history], "disk": disk, "room": room,
                         "folders": folders,
                         "swapped": [r.get("swapped_activation_bytes", 0) for r in history],
                         **{key: [r.get(key, 0) for r in history]
                            for key in ("device_up_bytes", "device_down_bytes", "device_updated_chunks")}}
    if dist.get_rank() == 0:
        torch.save(results, out)


def chunks_checkpoint(directory: str, out: str) -> None:
    """GPT 4 steps checkpointed at step 2 in memory under FSDP ZeRO-3 ("fsdp") and in chunks under
    ZeRO-3 over chunks ("chunks"); each step-2 checkpoint resumed by both strategies to step 4
    ("fsdp<-chunks" ...), from a model of other weights: losses and parameters of every run, and the
    saving runs' evaluation losses (3 micro batches over 2 ranks: one rank runs a spare forward)."""
    build = lambda: tiny_gpt(n_embd=64, n_layer=3, dropout=0.1)  # noqa: E731
    strategies = {"fsdp": lambda run: Strategy(zero=3),
                  "chunks": lambda run: Strategy(offload="chunks", offload_dir=f"{directory}/states/{run}", zero=3,
                                                 memory_budget=chunk_budget(16 * 2**20))}  # all fit: loading grows the process
    results = {}
    for name in ("fsdp", "chunks"):
        trainer = Trainer(build(), config(max_steps=4, lr=1e-3, checkpoint_every=2, checkpoint_dir=f"{directory}/{name}"),
                          strategies[name](name))
        history = trainer.fit(lm_examples(64))
        results[name] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history],
                         "eval": trainer.evaluate(lm_examples(6))["eval_loss"]}
    for saved in ("fsdp", "chunks"):
        for name in ("fsdp", "chunks"):
            trainer = Trainer(tiny_gpt(n_embd=64, n_layer=3, dropout=0.1, seed=123), config(max_steps=4, lr=1e-3),
                              strategies[name](f"{name}-{saved}"))
            trainer.resume(f"{directory}/{saved}/step_00000002")
            history = trainer.fit(lm_examples(64))
            results[f"{name}<-{saved}"] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history]}
    if dist.get_rank() == 0:
        torch.save(results, out)


def optimizer_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Full AdamW moments by parameter name (collective)."""
    state = trainer.optimizer.state_dict()
    names = [slot.fqn for slot in trainer.optimizer.slots]
    gathered: dict[str, torch.Tensor] = {}
    for name in names:
        for key in ("exp_avg", "exp_avg_sq"):
            gathered[f"{name}.{key}"] = full(state[name][key])
    return gathered


def dump(trainer: Trainer, out: str) -> None:
    params = trainer.full_state_dict()
    moments = optimizer_state(trainer)
    if dist.get_rank() == 0:
        torch.save({"params": params, "optimizer": moments, "step": trainer.step}, out)


def save(directory: str, zero: str) -> None:
    trainer = Trainer(tiny_gpt(), config(max_steps=2, checkpoint_dir=directory), Strategy(zero=int(zero)))
    trainer.fit(lm_examples(64))
    dump(trainer, str(Path(directory) / "saved.pt"))


def unreadable(directory: str, out: str) -> None:
    """Resume DIR's checkpoint while rank 0's integrity pass fails to read a file (OSError): what
    each rank raised."""
    import trainers.state.checkpoint as checkpoint

    def failing_disk(path):
        raise OSError(5, "Input/output error", str(path))

    trainer = Trainer(tiny_gpt(seed=123), config(max_steps=2, checkpoint_dir=directory), Strategy(zero=3))
    crc32 = checkpoint.file_crc32
    if dist.get_rank() == 0:
        checkpoint.file_crc32 = failing_disk
    try:
        trainer.resume()
        raised = None
    except OSError as error:
        raised = f"{type(error).__name__}: {error}"
    finally:  # the launch's later commands save checkpoints
        checkpoint.file_crc32 = crc32
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, raised)
    if dist.get_rank() == 0:
        torch.save(gathered, out)


def load(directory: str, zero: str, out: str) -> None:
    trainer = Trainer(tiny_gpt(seed=123), config(max_steps=2, checkpoint_dir=directory), Strategy(zero=int(zero)))
    if not trainer.resume():
        raise SystemExit("nothing to resume")
    dump(trainer, out)


def memory(out: str, zero: str) -> None:
    model = tiny_gpt(n_embd=64, n_layer=4, vocab_size=256)
    numel = sum(p.numel() for p in model.parameters())
    trainer = Trainer(model, config(max_steps=2, measure_memory=True), Strategy(zero=int(zero)))
    trainer.fit(lm_examples(64, vocab=256))
    if dist.get_rank() == 0:
        torch.save({"numel": numel, "reports": trainer.memory_report()}, out)


def evaluate(out: str) -> None:
    trainer = Trainer(tiny_gpt(), config(eval_batches=3), Strategy(zero=3))
    result = trainer.evaluate(lm_examples(5, seed=7))
    if dist.get_rank() == 0:
        torch.save(result, out)


def transducer(out: str, loss: str, *zeros: str) -> None:
    """The tiny transducer with objective `loss`, 3 steps of 8 token utterances at each ZeRO stage
    (the pruned warm-up half done, so both pruned losses count): parameters and losses."""
    features, mask, labels = token_utterances(32, seed=5)
    examples = [{"input_features": x[: int(m.sum())], "labels": y[y >= 0]} for x, m, y in zip(features, mask, labels)]
    results = {}
    for zero in zeros:
        model = tiny(loss=loss, warm_steps=6, prune_range=3, samplewise_memory_budget=1)
        trainer = Trainer(model, config(lr=3e-3), Strategy(zero=int(zero)))
        history = trainer.fit(examples, collate_fn=collate_speech)
        results[zero] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history]}
    if dist.get_rank() == 0:
        torch.save(results, out)


def dropout(out: str) -> None:
    trainer = Trainer(tiny_gpt(dropout=0.5), config(), Strategy(zero=2))
    history = trainer.fit(lm_examples(64))
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"params": params, "losses": [r["loss"] for r in history]}, out)


def tp_config(**overrides) -> TrainConfig:
    """SGD-like conditions for parity: AdamW at lr 1e-3 does not amplify summation-order noise."""
    return config(lr=1e-3, **overrides)


def tensor_parallel(out: str, *runs: str) -> None:
    results = {}
    for run in runs:
        model, tp, zero, sequence_parallel, *compiled = run.split("/")
        strategy = Strategy(zero=int(zero), tp=int(tp), sequence_parallel=sequence_parallel == "1",
                            compile="blocks" if compiled == ["compiled"] else "none")
        build, examples, collate = TP_MODELS[model]
        trainer = Trainer(build(), tp_config(), strategy)
        data = examples(64)
        torch.manual_seed(7)  # the same probe batch on every rank (random crops draw from it)
        probe = (collate or default_collate)([data[0], data[1]])
        trainer.model.train()
        trainer.model(**probe)["loss"].backward()
        trainer.partial_gradients.sum()  # as the trainer's step does after its backward passes
        grads = {clean_fqn(n): full(p.grad) for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.optimizer.zero_grad()
        history = trainer.fit(data, collate_fn=collate)
        results[run] = {"params": trainer.full_state_dict(), "grads": grads, "losses": [r["loss"] for r in history],
                        "compiled_calls": sum(f.compiled_calls for f in compiled_forwards(trainer.model))}
    if dist.get_rank() == 0:
        torch.save(results, out)


def tp_save(directory: str) -> None:
    trainer = Trainer(TP_MODELS["gpt"][0](), tp_config(max_steps=4, checkpoint_every=2, checkpoint_dir=directory),
                      Strategy(zero=3, tp=2))
    history = trainer.fit(lm_examples(64))
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"params": params, "losses": [r["loss"] for r in history]}, Path(directory) / "run.pt")


def tp_resume(directory: str, tp: str, zero: str, out: str) -> None:
    trainer = Trainer(tiny_gpt(seed=123, bias=True), tp_config(max_steps=4, checkpoint_dir=directory),
                      Strategy(zero=int(zero), tp=int(tp)))
    trainer.resume(Path(directory) / "step_00000002")
    loaded = {name: value.clone() for name, value in trainer.full_state_dict().items()}  # may alias the parameters
    history = trainer.fit(lm_examples(64))
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"loaded": loaded, "params": params, "losses": [r["loss"] for r in history]}, out)


def tp_activations(out: str) -> None:
    """Bytes autograd keeps for GPT's first block (width 32, 4 heads, 2 x 16 tokens), split over
    all ranks by tensor parallelism, without and with sequence parallelism."""
    from torch.distributed.tensor import DTensor

    from trainers.parallel.mesh import setup_distributed
    from trainers.memory.saved_activations import SavedActivations
    from trainers.parallel.tensor import apply_tensor_parallel
    from zoo.plan import model_plan

    world = int(os.environ.get("WORLD_SIZE", "1"))
    env = setup_distributed(world)
    results = {}
    for sequence_parallel in (False, True) if world > 1 else (False,):
        model = tiny_gpt(n_head=4)
        if world > 1:
            apply_tensor_parallel(model, model_plan(model), env.mesh["tp"], sequence_parallel)
        saved = SavedActivations(exclude=[p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()])
        model.blocks[0].register_forward_pre_hook(lambda *_: saved.__enter__() and None)
        model.blocks[0].register_forward_hook(lambda *_: saved.__exit__(None, None, None))
        ids = torch.stack([e["input_ids"] for e in lm_examples(2)])
        model(ids, labels=ids)["loss"].backward()
        results[sequence_parallel] = saved.bytes
    if dist.get_rank() == 0:
        torch.save(results, out)


def tp_checks(out: str) -> None:
    """Draws inside a region come from each rank's own stream, outside from the shared one; a
    sequence of 15 positions cannot be split over 2 ranks."""
    draws = {}

    class Recorder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

        def parallel_plan(self) -> ModelPlan:
            return ModelPlan(colwise=("up",), rowwise=("down",))

        def forward(self, input_ids, labels):
            draws["before"] = torch.rand(3)
            hidden = self.up(input_ids.float()[..., :4])
            draws["after"] = torch.rand(3)
            return {"loss": self.down(hidden).sum()}

    trainer = Trainer(Recorder(), tp_config(global_batch_size=2, micro_batch_size=2, max_steps=1), Strategy(tp=2))
    hooked = {}

    def draw_inside(*_) -> None:  # runs before the region's own exit hook: inside the region
        hooked["inside"] = torch.rand(3)

    trainer.model.up.register_forward_hook(draw_inside, prepend=True)
    trainer.fit(lm_examples(4))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {**draws, **hooked})
    trainer = Trainer(tiny_gpt(), tp_config(global_batch_size=2, micro_batch_size=2, max_steps=1),
                      Strategy(tp=2, sequence_parallel=True))
    try:
        trainer.fit(lm_examples(4, length=15))
    except ValueError as error:
        message = str(error)
    trainer = Trainer(tiny_fold(), tp_config(global_batch_size=2, micro_batch_size=2, max_steps=1), Strategy(tp=2))
    chains = [chain for chain in load_chains("train") if len(chain.sequence) >= 15][:4]
    try:
        trainer.fit(FoldingExamples(chains, CropConfig(crop_size=15, msa_rows=4)), collate_fn=collate_folding)
    except ValueError as error:
        axial_message = str(error)
    with torch.device("meta"):  # built without memory, each rank materialises only its shards
        model = tiny_gpt()
    trainer = Trainer(model, tp_config(global_batch_size=2, micro_batch_size=2, max_steps=1), Strategy(tp=2, zero=3))
    history = trainer.fit(lm_examples(4))
    weight = trainer.model.blocks[0].attn.q.weight
    meta = {"local_shape": tuple(weight.to_local().shape), "std": weight.full_tensor().std().item(),
            "loss": history[-1]["loss"]}
    errors = vocab_parallel_loss()
    if dist.get_rank() == 0:
        torch.save({"draws": gathered, "error": message, "axial_error": axial_message, "meta": meta,
                    "vocab_parallel": errors}, out)


def vocab_parallel_loss() -> dict[str, float]:
    """The fused linear + cross-entropy over a 49-row head split 25 + 24 (with bias, label smoothing,
    ignored labels, chunks of 5 tokens) against float64 F.cross_entropy of the whole logits:
    relative errors of the loss and the gradients (hidden whole, weight and bias this rank's rows)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from trainers.parallel.mesh import setup_distributed
    from trainers.parallel.vocab import install_vocab_parallel_loss
    from zoo.nn import linear_cross_entropy

    install_vocab_parallel_loss()
    mesh = setup_distributed(2).mesh["tp"]
    generator = torch.Generator().manual_seed(11)
    hidden, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((13, 16), (49, 16), (49,)))
    labels = torch.randint(0, 49, (13,), generator=generator)
    labels[[2, 7]] = -100
    reference = [t.double().requires_grad_() for t in (hidden, weight, bias)]
    expected = F.cross_entropy(reference[0] @ reference[1].T + reference[2], labels, label_smoothing=0.1)
    expected.backward()
    local = hidden.clone().requires_grad_()
    shards = [nn.Parameter(distribute_tensor(t, mesh, [Shard(0)], src_data_rank=None)) for t in (weight, bias)]
    loss = linear_cross_entropy(local, shards[0], labels, shards[1], label_smoothing=0.1, chunk_size=5)
    loss.backward()
    rows = slice(25 * mesh.get_local_rank(), 25 * mesh.get_local_rank() + shards[0].to_local().shape[0])
    error = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    return {"loss": abs(loss.item() - expected.item()) / expected.item(), "hidden": error(local.grad, reference[0].grad),
            "weight": error(shards[0].grad.to_local(), reference[1].grad[rows]),
            "bias": error(shards[1].grad.to_local(), reference[2].grad[rows])}


COMMANDS = {"strategies": strategies, "scalars": scalars, "routed": routed, "save": save, "load": load,
            "unreadable": unreadable, "memory": memory, "evaluate": evaluate,
            "transducer": transducer, "chunks_checkpoint": chunks_checkpoint, "dropout": dropout,
            "tensor_parallel": tensor_parallel, "tp_save": tp_save, "tp_resume": tp_resume, "tp_checks": tp_checks,
            "tp_activations": tp_activations, "chunks": chunks, "experts": experts,
            "expert_checks": expert_checks, "expert_save": expert_save, "expert_resume": expert_resume,
            "library": library, "budget": budget}


if __name__ == "__main__":
    run_commands(COMMANDS, sys.argv[1:])
    shutdown_distributed()
    exit_process(0)
