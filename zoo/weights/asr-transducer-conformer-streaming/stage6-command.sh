#!/bin/sh
# Session 53: entry (a)'s shipped weights (stage 2) evaluated anew with Whisper tiny.en's second pass over
# the final beam (`asr.whisper_rescoring`), as entry (b)'s stage 8: its weight and bonus, and whether Whisper's
# own greedy transcript joins the hypotheses, chosen on validation and validation_kokoro pooled (200 each),
# leaving each utterance's own text source out; the language-model weight and lexicon penalty as stage 5
# chose them (0.4, 5). Nothing trains.
# (The folder it writes was then copied into zoo/weights/asr-transducer-conformer-streaming: stage 6.)
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --init asr-transducer-conformer-streaming \
  --corpus.text modern --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 \
  --model.encoder.dynamic_chunks 25 --lm_unit token --lm_order 8 --lm_text training_text --lm_sources wordnet \
  --lm_tuning leave_source_out --lm_weights 0.4 --lexicon_penalties 5 --evaluate_only true \
  --tuning_sets validation,validation_kokoro --tuning_utterances 200 \
  --rescore_weights 0,0.5,1,1.5,2,3 --rescore_bonuses 0,1,2,3 --rescore_transcript false,true \
  --evaluation_utterances 100 --output runs/s53/a-transcript/asr-transducer-conformer-streaming
