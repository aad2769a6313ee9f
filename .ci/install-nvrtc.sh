# Sourced by .ci/run before `cargo test --workspace`: installs NVRTC (CUDA 13.0)
# from PyPI and puts its library folder on the loader path, so gpumux-cuda's
# tests compile every transformed suite kernel. No GPU or CUDA toolkit needed.
# Without network or pip the tests still pass and print that they skipped.
_gpumux_nvrtc_py=$(command -v python3 || command -v python || true)
if [ -n "$_gpumux_nvrtc_py" ]; then
    "$_gpumux_nvrtc_py" -m pip install --quiet --disable-pip-version-check 'nvidia-cuda-nvrtc==13.0.*' >/dev/null 2>&1 \
        || echo "install-nvrtc: pip install nvidia-cuda-nvrtc==13.0.* failed; NVRTC tests will skip" >&2
    _gpumux_nvrtc_dir=$("$_gpumux_nvrtc_py" - <<'PY' 2>/dev/null
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for p in nvidia.__path__:
    d = os.path.join(p, "cu13", "lib")
    if os.path.exists(os.path.join(d, "libnvrtc.so.13")):
        print(d)
        break
PY
)
    if [ -n "$_gpumux_nvrtc_dir" ]; then
        export LD_LIBRARY_PATH="$_gpumux_nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "install-nvrtc: libnvrtc in $_gpumux_nvrtc_dir"
    else
        echo "install-nvrtc: libnvrtc.so.13 not found after install; NVRTC tests will skip" >&2
    fi
else
    echo "install-nvrtc: no python3; NVRTC tests will skip" >&2
fi
unset _gpumux_nvrtc_py _gpumux_nvrtc_dir
