"""What a run carries from step to step and into its checkpoints: the optimizer, the learning-rate
schedule, the fp16 loss scale, gradient norms and clipping, checkpoints and what a resume may change,
and which parameters train at all (`adapter`: LoRA adapters on a frozen model)."""
