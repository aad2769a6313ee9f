#!/usr/bin/env bash
# The Python package (issue 41, crates/gpumux-py): builds its one abi3 wheel with maturin,
# installs it into a fresh virtual environment (pip install + `import gpumux` must take
# under 10 s: NumPy, its one dependency, is fetched into the wheel folder first, so the
# time is pip's and the package's, not the network's), and runs the pytest suite there
# against gpumuxd on sim:h100 (target/release/gpumuxd, which `cargo test --release` built).
#
# Run by .ci/run. Needs python3 (venv, pip) and PyPI for maturin, NumPy and pytest; if
# those cannot be installed it says SKIPPED and exits 0, as the NVRTC install does (a
# build, an install, a test or the time goal failing fails CI).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v python3 || true)
if [ -z "$py" ] || ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "ci: SKIPPED the Python package: no python3 with venv and pip"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip_q=(--quiet --disable-pip-version-check)
"$py" -m venv "$work/build"
if ! "$work/build/bin/pip" install "${pip_q[@]}" 'maturin>=1.9.4,<2' ||
    ! "$work/build/bin/pip" download "${pip_q[@]}" --only-binary=:all: -d "$work/wheels" numpy pytest; then
    echo "ci: SKIPPED the Python package: pip could not install maturin or fetch numpy and pytest (no PyPI?)"
    exit 0
fi
# The package's types (inline, and the extension's stubs, _native.pyi) hold together.
if "$work/build/bin/pip" install "${pip_q[@]}" mypy numpy; then
    (cd crates/gpumux-py/python && "$work/build/bin/mypy" --strict --no-error-summary -p gpumux)
    echo "ci: mypy --strict passes on the gpumux package"
else
    echo "ci: SKIPPED mypy: pip could not install it"
fi
"$work/build/bin/maturin" build --release --quiet -m crates/gpumux-py/Cargo.toml -o "$work/wheels"
wheel=$(ls "$work"/wheels/gpumux-*-cp39-abi3-*.whl)
echo "ci: built $(basename "$wheel")"
# What the wheel must hold: the extension, the stubs, the typed marker.
"$py" - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"gpumux/__init__.py", "gpumux/_native.pyi", "gpumux/py.typed", "gpumux/cupy.py", "gpumux/sim.py"}
missing = need - names
assert not missing, f"the wheel lacks {sorted(missing)}"
assert any(n.startswith("gpumux/_native") and n.endswith(".so") for n in names), "the wheel has no extension"
PY
"$py" -m venv "$work/venv"
start=$(date +%s%N)
"$work/venv/bin/pip" install "${pip_q[@]}" --no-index --find-links "$work/wheels" gpumux
"$work/venv/bin/python" -c 'import gpumux'
ms=$((($(date +%s%N) - start) / 1000000))
echo "ci: pip install of the wheel (and NumPy) into a fresh venv, then import gpumux: ${ms} ms (goal: under 10 s)"
if [ "$ms" -ge 10000 ]; then
    echo "ci: FAILED the install goal: ${ms} ms is not under 10 s" >&2
    exit 1
fi
"$work/venv/bin/pip" install "${pip_q[@]}" --no-index --find-links "$work/wheels" pytest
# From the repository root, where no `gpumux` folder shadows the installed package.
GPUMUXD=$(realpath "${CARGO_TARGET_DIR:-target}")/release/gpumuxd "$work/venv/bin/python" -m pytest -q -p no:cacheprovider crates/gpumux-py/tests
