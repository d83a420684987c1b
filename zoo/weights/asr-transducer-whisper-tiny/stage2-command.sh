#!/bin/sh
# Stage 2 of entry (b), session 45: stage 1's model (runs/asr-whisper-k2/command.sh) trained further on
# the same corpus with a schedule of its own.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.2 --tokens bpe --bpe_vocab_size 500 --lm_unit token --lm_text training_text \
  --lm_weights 0.1,0.2,0.3,0.4 --model.context_size 2 --augment.speeds 0.9,1.0,1.1 --augment.noise 0.5 \
  --augment.reverb 0.3 --init runs/asr-whisper-k2/model --train.lr 3e-4 --train.lr_scales encoder.=0.5 \
  --train.warmup_steps 100 --train.max_steps 800 --train.eval_every 400 --train.checkpoint_every 200 \
  --train.checkpoint_dir runs/asr-whisper-k2b/checkpoints --train.output_dir runs/asr-whisper-k2b \
  --train.progress false --evaluation_utterances 100 --output runs/asr-whisper-k2b/asr-transducer-whisper-tiny
