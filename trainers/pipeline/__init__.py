"""Pipeline parallelism: where a model's blocks cut into stages (balance, split), the stages a rank
holds, the schedules, the runtime that runs them, the point-to-point transfers and the stages'
data-parallel sharding."""
