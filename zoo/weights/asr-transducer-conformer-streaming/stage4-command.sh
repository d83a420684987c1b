#!/bin/sh
# Entry (a)'s shipped weights (stage 2) evaluated anew (session 49), stage 3's command on corpus layout 3,
# where piper speaks each clip the same on every machine: nothing trains; the language-model weight and
# the lexicon penalty are chosen on validation, every set decoded again.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --init asr-transducer-conformer-streaming \
  --corpus.text modern --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 \
  --model.encoder.dynamic_chunks 25 --lm_unit token --lm_order 8 --lm_text training_text \
  --lm_weights 0.2,0.4,0.6,0.8 --lexicon_penalties 0,5,10,20,30 --evaluate_only true --evaluation_utterances 100 \
  --output runs/asr-conformer-seeded/asr-transducer-conformer-streaming
