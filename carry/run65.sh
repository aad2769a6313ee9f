#!/usr/bin/env bash
# Session 12, call 14: the daemon check on the session's final build (the client library's error mapping changed).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
