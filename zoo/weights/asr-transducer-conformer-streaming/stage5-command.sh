#!/bin/sh
# Entry (a)'s shipped weights (stage 2) evaluated anew (session 50): nothing trains. The language model
# reads WordNet's usage examples beside the training text; its weight and the lexicon penalty are chosen
# leaving each validation utterance's own text source out of the language model's and lexicon's text.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --init asr-transducer-conformer-streaming \
  --corpus.text modern --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 \
  --model.encoder.dynamic_chunks 25 --lm_unit token --lm_order 8 --lm_text training_text --lm_sources wordnet \
  --lm_tuning leave_source_out --lm_weights 0.2,0.4,0.6,0.8 --lexicon_penalties 0,5,10,20,30 --evaluate_only true \
  --evaluation_utterances 100 --output runs/s50/a-loso/asr-transducer-conformer-streaming
