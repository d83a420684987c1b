#!/bin/sh
# OPUS-MT zh -> en fine-tuned on the Chinese messages of gcc's and git's Debian catalogues (issue 75
# item 4b, session 59): 150 steps of 16 pairs, 2 threads, 6 minutes. The model (315 MB) is not
# shipped; its card, log and every evaluated sentence (before and after) sit beside this file.
OMP_NUM_THREADS=2 .venv/bin/zoo train translation --task finetune --train.lr 1e-4 --train.max_steps 150 \
    --train.warmup_steps 15 --train.global_batch_size 16 --train.micro_batch_size 16 --train.eval_every 150 \
    --train.log_every 25 --train.progress false --evaluation_sentences 0 \
    --train.output_dir runs/translation-finetune --output /tmp/ftrun/translator-opus-zh-en-software
