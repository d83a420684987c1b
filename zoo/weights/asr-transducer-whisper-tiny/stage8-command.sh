#!/bin/sh
# Session 53: entry (b)'s shipped weights (stage 3) evaluated anew with Whisper tiny.en's second pass, now
# in torch, choosing too whether Whisper's own greedy transcript joins the final beam's hypotheses (scored by
# the transducer over all the alignments its search can take, with the same language-model terms); the
# language-model weight and lexicon penalty as stage 7 passed them (0.2, 15); a wider grid of rescoring
# weights and bonuses. Chosen leave-one-source-out on validation and validation_kokoro pooled.
# (The folder it writes was then copied into zoo/weights/asr-transducer-whisper-tiny: stage 8.)
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 --tokens bpe --bpe_vocab_size 500 --lm_unit token \
  --lm_text training_text --lm_sources wordnet --lm_tuning leave_source_out --lm_weights 0.2 \
  --lexicon_penalties 15 --model.context_size 2 --init asr-transducer-whisper-tiny --evaluate_only true \
  --tuning_sets validation,validation_kokoro --tuning_utterances 200 \
  --rescore_weights 0,0.5,1,1.5,2,3 --rescore_bonuses 0,1,2,3 --rescore_transcript false,true \
  --evaluation_utterances 100 --output runs/s53/b-transcript/asr-transducer-whisper-tiny
