#!/bin/sh
# The shipped spoken-digit spotter (issue 76 item 5, session 61): the keywords recipe's defaults (FSDD's
# theo held out), 2 threads on the project's 2-core CPU, about 5 minutes. Its log: train.log. The folder
# was written to /tmp, then copied here whole.
OMP_NUM_THREADS=2 .venv/bin/zoo train keywords --train.progress false --output /tmp/kws/ship/kws-digits
