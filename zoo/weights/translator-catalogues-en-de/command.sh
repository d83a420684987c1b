#!/bin/sh
# English -> German from scratch on Debian's catalogues (issue 75 item 4a, session 59): the recipe's
# defaults, 5,000 steps; 2 threads on the project's 2-core CPU, 85 minutes. Its log: train.log.
# The folder was written to /tmp, then copied here whole.
OMP_NUM_THREADS=2 .venv/bin/zoo train translation --train.max_steps 5000 --train.progress false \
    --output /tmp/trrun/translator-catalogues-en-de
