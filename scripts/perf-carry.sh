#!/usr/bin/env bash
# Prepares a CPU profile of the daemon on the GPU machine, which has no perf:
#   carry/perf/   this machine's perf and the libraries it needs beyond glibc
#                 (Debian's perf 6.1 ran there with the software cpu-clock event,
#                 2026-11-26; the GPU machine's kernel has no hardware counters);
#   carry/daemon/ as scripts/daemon-gpu-prep.sh builds it, but gpumux and gpumuxd
#                 keep their symbol tables (strip --strip-debug), so the
#                 profile names functions.
# Then run scripts/profile-daemon-gpu.sh there with carry ["carry/daemon", "carry/perf"].
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
perf=$(command -v perf) || { echo "no perf on this machine (apt-get install linux-perf)" >&2; exit 1; }
rm -rf carry/perf; mkdir -p carry/perf/lib
cp "$perf" carry/perf/perf
ldd "$perf" | awk '$3 ~ /^\// {print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" carry/perf/lib/; done
bash scripts/daemon-gpu-prep.sh
for b in gpumux gpumuxd; do
    cp "$target/release/$b" "carry/daemon/$b"
    strip --strip-debug "carry/daemon/$b"
done
du -sh carry/perf carry/daemon
