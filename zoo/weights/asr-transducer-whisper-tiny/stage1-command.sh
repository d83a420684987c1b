#!/bin/sh
# Entry (b) of issue 28 from the pretrained Whisper tiny.en encoder in one run (session 45):
# the head first on the frozen encoder's cached outputs, then the whole model, the encoder at half
# the learning rate; Kokoro speaks a fifth of the training sentences.
OMP_NUM_THREADS=2 .venv/bin/zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern \
  --corpus.kokoro_share 0.2 --tokens bpe --bpe_vocab_size 500 --lm_unit token --lm_text training_text \
  --lm_weights 0.2,0.3,0.4,0.5,0.6 --model.context_size 2 --augment.speeds 0.9,1.0,1.1 --augment.noise 0.5 \
  --augment.reverb 0.3 --head_steps 2500 --head_views 2 --train.lr 5e-4 --train.lr_scales encoder.=0.5 \
  --train.warmup_steps 150 --train.max_steps 1200 --train.eval_every 400 --train.checkpoint_every 200 \
  --train.checkpoint_dir runs/asr-whisper-k2/checkpoints --train.output_dir runs/asr-whisper-k2 \
  --train.progress false --evaluation_utterances 100 --output runs/asr-whisper-k2/model
