"""Models written in the tests, in plain torch.nn (none from the zoo), for the multi-process
parity scenarios of worker.py and pipeline_worker.py: 0-dim parameters, micro batches that choose
the parameters they train, and feed-forward language models with their own tensor- and
pipeline-parallel plans."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.plan import ModelPlan, PipelineSplit


class ScaledLinear(nn.Module):
    """A linear layer whose output a learned 0-dim parameter scales."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, out)
        self.scale = nn.Parameter(torch.tensor(0.8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)) * self.scale


class GainedRegression(nn.Module):
    """Two blocks (FSDP units), one holding a 0-dim parameter, and a 0-dim gain at the root."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([ScaledLinear(4, 16), nn.Linear(16, 1)])
        self.gain = nn.Parameter(torch.tensor(0.5))

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("blocks.*",))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        prediction = self.blocks[1](self.blocks[0](x)).squeeze(-1) * self.gain
        return {"loss": F.mse_loss(prediction.float(), y)}


class Routed(nn.Module):
    """A trunk and two heads, each micro batch training one of them, as its inputs decide: ranks
    use different parameters in a step, in an order that depends on their data."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head_a, self.head_b, self.out = (nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 64),
                                                          nn.Linear(64, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        head = self.head_a if x[:, 0].sum() > 0 else self.head_b
        return {"loss": F.mse_loss(self.out(torch.tanh(head(torch.tanh(self.trunk(x))))).squeeze(-1), y)}


class ResidualFeedForward(nn.Module):
    """x + down(gelu(up(x))) in plain linears."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class FeedForwardLM(nn.Module):
    """A model written here, not from the zoo, in plain torch.nn with its own parallel plan: a
    vocabulary-parallel embedding, two residual feed-forward layers whose column- and row-parallel
    linears are their own regions, a LayerNorm and a whole linear head; under pipeline
    parallelism the layers split between the embedding and the head."""

    def __init__(self, vocab: int = 49, width: int = 32, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(ResidualFeedForward(width, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("layers.*",), colwise=("layers.*.up",), rowwise=("layers.*.down",),
                         vocab_parallel=("embed",), pipeline=PipelineSplit(pre=("embed",), post=("norm", "head")))

    def pipeline_enter(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden": self.embed(input_ids)}

    def pipeline_block(self, block: nn.Module, carry: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"hidden": block(carry["hidden"])}

    def pipeline_exit(self, carry: dict[str, torch.Tensor], input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(carry["hidden"]))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        carry = self.pipeline_enter(input_ids, labels)
        for layer in self.layers:
            carry = self.pipeline_block(layer, carry)
        return {"loss": self.pipeline_exit(carry, input_ids, labels)}


class GainedFeedForward(nn.Module):
    """down(gelu(up(x)) * gain): a tensor-parallel region with a learned gain of its own."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.gain = nn.Parameter(torch.full((1,), 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)) * self.gain)


class GainedLayer(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ff = GainedFeedForward(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(x)


class GainedLM(FeedForwardLM):
    """`FeedForwardLM` whose layers' feed-forward regions each hold a learned gain, which the plan
    keeps whole on every rank (`ModelPlan.replicated`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layers = nn.ModuleList(GainedLayer(32, 64) for _ in range(2))

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("layers.*",), colwise=("layers.*.ff.up",), rowwise=("layers.*.ff.down",),
                         regions=("layers.*.ff",), replicated=("layers.*.ff",), vocab_parallel=("embed",))


class UnregionedGainedLM(GainedLM):
    """`GainedLM` planned without regions, as transformers plans its models: each column-parallel
    linear gives its shard to the row-parallel one after it, and the learned gain between them meets
    the shards. `summed`: the plan keeps the gain whole with its gradient summed (`replicated`);
    otherwise it names nothing for it, which must be refused."""

    def __init__(self, summed: bool) -> None:
        super().__init__()
        self.summed = summed

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("layers.*",), colwise=("layers.*.ff.up",), rowwise=("layers.*.ff.down",),
                         replicated=("layers.*.ff",) if self.summed else (), vocab_parallel=("embed",))


class MemoryFeedForward(nn.Module):
    """down(gelu(up(x) + mean over positions of mem(memory))): a region whose second input, the
    memory, comes by keyword."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.mem, self.down = nn.Linear(width, hidden), nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor, *, memory: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x) + self.mem(memory).mean(1, keepdim=True)))


class KeywordMemoryLM(FeedForwardLM):
    """`FeedForwardLM` whose layers also read a learned memory (4 positions), passed into each
    tensor-parallel region by keyword: its gradient must be summed over the ranks as a positional
    one's is."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.layers = nn.ModuleList(MemoryFeedForward(32, 64) for _ in range(2))
        self.memory = nn.Parameter(torch.randn(1, 4, 32))

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("layers.*",), colwise=("layers.*.up", "layers.*.mem"), rowwise=("layers.*.down",),
                         regions=("layers.*",), vocab_parallel=("embed",))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed(input_ids)
        memory = self.memory.expand(hidden.shape[0], -1, -1)
        for layer in self.layers:
            hidden = hidden + layer(hidden, memory=memory)
        logits = self.head(self.norm(hidden))
        return {"loss": F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())}


class HeadRoutedLM(FeedForwardLM):
    """`FeedForwardLM` with three output heads: each sequence goes through the head its first token
    chooses (token % 3), and a head no sequence of the micro batch chose is not called, so ranks use
    different parameters in a step, as multi-task heads do. `early_exit`: a sequence whose first
    token is even also skips the last layer, and a micro batch with no odd one never runs it, so a
    whole block may run on some ranks only."""

    def __init__(self, early_exit: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.heads = nn.ModuleList(nn.Linear(32, 49, bias=False) for _ in range(3))
        self.early_exit = early_exit

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.layers[0](self.embed(input_ids))
        if self.early_exit:
            deep = input_ids[:, 0] % 2 == 1
            if deep.any():
                hidden = torch.where(deep[:, None, None], self.layers[1](hidden), hidden)
        else:
            hidden = self.layers[1](hidden)
        hidden, choice = self.norm(hidden), input_ids[:, 0] % 3
        losses = []
        for index, head in enumerate(self.heads):
            rows = choice == index
            if rows.any():
                logits = head(hidden[rows])
                losses.append(F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[rows][:, 1:].flatten(),
                                              reduction="sum"))
        return {"loss": torch.stack(losses).sum() / (labels.shape[0] * (labels.shape[1] - 1))}
