#!/usr/bin/env bash
# Runs prebuilt gpumux-cuda test binaries on a machine with a GPU (they skip
# elsewhere). Build them with `cargo test --release -p gpumux-cuda --no-run` and
# pass their paths. Sets up NVRTC like scripts/cuda-device-run.sh.
#   scripts/cuda-device-tests.sh TEST_BINARY...
set -uo pipefail
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if command -v python3 >/dev/null; then
    wheel=$(python3 -c 'import nvidia, os; print([os.path.join(p, "cu13", "lib") for p in nvidia.__path__][0])' 2>/dev/null || true)
    [ -n "$wheel" ] && [ -d "$wheel" ] && export LD_LIBRARY_PATH="$wheel:${LD_LIBRARY_PATH:-}"
fi
status=0
for t in "$@"; do
    echo "=== $t"
    "$t" --nocapture --test-threads 1 2>&1 | grep -E "^test |SKIPPED|panicked|test result|assert" 
    [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
done
echo "=== status $status"
exit $status
