#!/bin/sh
# The keywords recipe with each FSDD speaker held out in turn (leave one speaker out), two runs at a
# time on one thread each; prints each run's held-out accuracy by digit.
#   sh benchmarks/keywords_loso.sh [OUT_DIR]
out=${1:-/tmp/keywords-loso}
mkdir -p "$out"
run() {
    OMP_NUM_THREADS=1 .venv/bin/zoo train keywords --held_out "$1" --train.progress false \
        --train.output_dir "$out/run-$1" --output "$out/kws-$1" > "$out/$1.log" 2>&1
}
for pair in "george jackson" "lucas nicolas" "theo yweweler"; do
    set -- $pair
    run "$1" & run "$2" & wait
done
grep -h "held-out speakers" "$out"/*.log
