#!/usr/bin/env bash
# Writes a workload TOML with N processes of one small kernel each, all
# arriving at time 0, on stdout. Used by scripts/process-scaling.sh to
# measure how the cost of a run grows with the number of processes.
#
#   scripts/gen-processes.sh N [BLOCKS_PER_KERNEL]
set -euo pipefail
n=${1:?usage: gen-processes.sh N [BLOCKS_PER_KERNEL]}
blocks=${2:-4}
awk -v n="$n" -v blocks="$blocks" 'BEGIN {
    printf "# %d processes, one %d-block kernel each (scripts/gen-processes.sh)\n", n, blocks
    printf "name = \"processes-%d\"\n", n
    for (i = 0; i < n; i++) {
        printf "\n[[process]]\nname = \"p%d\"\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\n", i
        printf "grid = %d\nblock = 128\nregs_per_thread = 32\nblock_time_us = 10.0\n", blocks
    }
}'
