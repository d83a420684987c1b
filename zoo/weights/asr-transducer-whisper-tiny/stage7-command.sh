#!/bin/sh
# Session 52: entry (b)'s shipped weights (stage 3) evaluated anew with Whisper tiny.en's second pass over the
# final beam: the language-model weight and lexicon penalty as chosen on the same 400 utterances (0.2, 15), then
# the rescoring's weight and bonus chosen on them (leave-one-source-out, validation and validation_kokoro pooled).
# (The folder it writes was then copied into zoo/weights/asr-transducer-whisper-tiny: stage 7.)
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 --tokens bpe --bpe_vocab_size 500 --lm_unit token \
  --lm_text training_text --lm_sources wordnet --lm_tuning leave_source_out --lm_weights 0.2 \
  --lexicon_penalties 15 --model.context_size 2 --init asr-transducer-whisper-tiny --evaluate_only true \
  --tuning_sets validation,validation_kokoro --tuning_utterances 200 \
  --rescore_weights 0,0.25,0.5,1 --rescore_bonuses 0,1,2 \
  --evaluation_utterances 100 --output runs/s52/b-rescored/asr-transducer-whisper-tiny
