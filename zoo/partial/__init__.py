"""zoo.partial: running small models in little memory (the Pex issue): the activation arena a
sequential executor needs (`arena`), an executor that runs a chain from one arena of that size
(`executor`), and partial execution, a slice of channels at a time (`pex`)."""

from zoo.partial.arena import ArenaPlan, Buffer, activation_buffers, plan_arena
from zoo.partial.executor import ArenaExecutor
from zoo.partial.pex import PartialSchedule, schedule

__all__ = ["ArenaExecutor", "ArenaPlan", "Buffer", "PartialSchedule", "activation_buffers", "plan_arena", "schedule"]
