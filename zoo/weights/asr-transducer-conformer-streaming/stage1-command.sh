#!/bin/sh
# Entry (a) of issue 28, session 46, first stage: the tiny Conformer from random weights on modern English,
# character tokens, trained with dynamic chunks (one model for full context and streaming), on the
# corpus where Kokoro speaks 30% of the training sentences (half of those in blends); no language model yet.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --corpus.text modern --corpus.kokoro_share 0.3 \
  --corpus.kokoro_blend_share 0.5 --lm_unit token --lm_order 0 --model.encoder.dynamic_chunks 25 \
  --augment.speeds 0.9,1.0,1.1 --augment.noise 0.5 --augment.reverb 0.3 --train.max_steps 1200 \
  --train.eval_every 600 --train.checkpoint_every 300 --train.checkpoint_dir runs/asr-conformer-a1/checkpoints \
  --train.output_dir runs/asr-conformer-a1 --train.progress false --evaluation_utterances 40 \
  --output runs/asr-conformer-a1/model
