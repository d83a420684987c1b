#!/bin/sh
# Entry (b)'s shipped weights (stage 3) evaluated anew (session 50): nothing trains. The language model
# reads WordNet's usage examples beside the training text; its weight and the lexicon penalty are chosen
# leaving each validation utterance's own text source out of the language model's and lexicon's text.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 --tokens bpe --bpe_vocab_size 500 --lm_unit token \
  --lm_text training_text --lm_sources wordnet --lm_tuning leave_source_out --lm_weights 0.1,0.2,0.3,0.4 \
  --lexicon_penalties 0,5,10,15,20,30 --model.context_size 2 --init asr-transducer-whisper-tiny --evaluate_only true \
  --evaluation_utterances 100 --output runs/s50/b-loso/asr-transducer-whisper-tiny
