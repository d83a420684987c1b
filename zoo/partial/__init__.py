"""zoo.partial: running small models in little memory (the Pex issue): the activation arena a
sequential executor needs (`arena`), partial execution, a slice of channels at a time (`pex`), and
executors that run either from one arena of the planned size (`executor`, on `kernels` that allocate
nothing); and a chain streamed a row at a time from one arena (`rows`)."""

from zoo.partial.arena import ArenaPlan, Buffer, activation_buffers, plan_arena
from zoo.partial.executor import ArenaExecutor, ScheduleExecutor
from zoo.partial.pex import PartialSchedule, schedule
from zoo.partial.rows import RowStream, stream

__all__ = ["ArenaExecutor", "ArenaPlan", "Buffer", "PartialSchedule", "RowStream", "ScheduleExecutor",
           "activation_buffers", "plan_arena", "schedule", "stream"]
