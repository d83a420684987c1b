"""zoo.partial: running small models in little memory (the Pex issue): the activation arena a
sequential executor needs (`arena`)."""

from zoo.partial.arena import ArenaPlan, Buffer, activation_buffers, plan_arena

__all__ = ["ArenaPlan", "Buffer", "activation_buffers", "plan_arena"]
