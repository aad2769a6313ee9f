# Sourced by the GPU scripts: puts NVRTC (CUDA 13) on the loader path for the daemon's and the
# benches' compiles: the CUDA toolkit's, and the pip wheel's (nvidia-cuda-nvrtc) before it when
# python3 has one. Changes nothing when neither is there.
for _nvrtc_dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$_nvrtc_dir/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$_nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if command -v python3 >/dev/null; then
    _nvrtc_dir=$(python3 -c 'import nvidia, os; print([os.path.join(p, "cu13", "lib") for p in nvidia.__path__][0])' 2>/dev/null || true)
    [ -n "$_nvrtc_dir" ] && [ -d "$_nvrtc_dir" ] && export LD_LIBRARY_PATH="$_nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
unset _nvrtc_dir
