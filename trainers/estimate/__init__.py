"""Will it fit, and how fast: the trainer's own step traced on fake tensors in a fake process group,
its work and traffic counted, the ZeRO closed form, the memory-budget search and the planner."""
