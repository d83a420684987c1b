#!/bin/sh
# Entry (a) of issue 28, session 47, second stage: continues the first stage (runs/asr-conformer-a1/model,
# 1,200 steps from random weights, session 46) with the same corpus and flags for 8,000 more steps (the
# schedule restarts: 150 warm-up steps to 2e-3, cosine to 4e-5), then fits the character 8-gram language
# model of the training text and picks its weight on validation.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --init runs/asr-conformer-a1/model \
  --corpus.text modern --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 \
  --model.encoder.dynamic_chunks 25 --augment.speeds 0.9,1.0,1.1 --augment.noise 0.5 --augment.reverb 0.3 \
  --lm_unit token --lm_order 8 --lm_text training_text --lm_weights 0.2,0.4,0.6,0.8 \
  --train.max_steps 8000 --train.eval_every 2000 --train.checkpoint_every 500 \
  --train.checkpoint_dir runs/asr-conformer-a2/checkpoints --train.output_dir runs/asr-conformer-a2 \
  --train.progress false --evaluation_utterances 100 --output runs/asr-conformer-a2/asr-transducer-conformer-streaming
