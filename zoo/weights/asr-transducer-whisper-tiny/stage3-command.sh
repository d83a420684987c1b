#!/bin/sh
# Stage 3 of entry (b), session 46: the shipped asr-transducer-whisper-tiny (stage 2) trained further on a
# corpus where Kokoro speaks 30% of the training sentences, half of those in a blend of two of its voices.
# --init reads the entry as committed at effce4d (stage 2): to rerun this, put that version's
# zoo/weights/asr-transducer-whisper-tiny back first (git checkout effce4d -- zoo/weights/asr-transducer-whisper-tiny).
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.3 --corpus.kokoro_blend_share 0.5 --tokens bpe --bpe_vocab_size 500 --lm_unit token \
  --lm_text training_text --lm_weights 0.1,0.2,0.3,0.4 --model.context_size 2 --augment.speeds 0.9,1.0,1.1 \
  --augment.noise 0.5 --augment.reverb 0.3 --init asr-transducer-whisper-tiny --train.lr 3e-4 \
  --train.lr_scales encoder.=0.5 --train.warmup_steps 100 --train.max_steps 2000 --train.eval_every 400 \
  --train.checkpoint_every 200 --train.checkpoint_dir runs/asr-whisper-k3/checkpoints \
  --train.output_dir runs/asr-whisper-k3 --train.progress false --evaluation_utterances 100 \
  --output runs/asr-whisper-k3/asr-transducer-whisper-tiny
