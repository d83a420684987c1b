#!/bin/sh
# Entry (b)'s shipped weights (stage 3) evaluated anew (session 49): nothing trains. The language model
# reads WordNet's usage examples beside the training text; its weight and the lexicon penalty are
# chosen on validation; every set decoded again, piper's clips now seeded (corpus layout 3).
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 --tokens bpe --bpe_vocab_size 500 --lm_unit token \
  --lm_text training_text --lm_sources wordnet --lm_weights 0.1,0.2,0.3,0.4 --lexicon_penalties 0,5,10,15,20,30 \
  --model.context_size 2 --init asr-transducer-whisper-tiny --evaluate_only true --evaluation_utterances 100 \
  --output runs/asr-whisper-wordnet/asr-transducer-whisper-tiny
