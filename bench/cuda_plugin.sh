# Sourced by the device checks (bench/gpu_check.sh, bench/sim_gpu_check.sh):
# finds CUDA and defines build_cuda_plugin OUT, which builds the CUDA
# backend plugin (libcohort_cuda.so) with this machine's nvcc.
# CUDA: /usr/local/cuda, or nvcc on PATH with cudart and cuBLAS beside it or
# in the pip wheels (nvidia-cublas-cu12, nvidia-cuda-runtime-cu12).
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_home=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
cuda_inc=(-I"$cuda_home/include")
cuda_libs=(-L"$cuda_home/lib64" -lcublas -lcudart -Xlinker -rpath="$cuda_home/lib64")
if [[ -x $NVCC && ! -e $cuda_home/include/cublas_v2.h ]]; then
  wheels=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0] + "/x"))')
  cuda_inc=(-I"$wheels/cublas/include" -I"$wheels/cuda_runtime/include")
  cuda_libs=("$wheels/cublas/lib/libcublas.so."* "$wheels/cuda_runtime/lib/libcudart.so."*
             -Xlinker -rpath="$wheels/cublas/lib:$wheels/cuda_runtime/lib")
fi

# NCCL (device collectives): beside CUDA, or in the pip wheel
# (nvidia-nccl-cu12); without it the plugin is built without them.
nccl=(-DCOHORT_HAVE_NCCL=0)
if [[ -e $cuda_home/include/nccl.h ]]; then
  nccl=(-DCOHORT_HAVE_NCCL=1 -lnccl)
elif nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) &&
     [[ -e $nccl_dir/include/nccl.h ]]; then
  nccl=(-DCOHORT_HAVE_NCCL=1 -I"$nccl_dir/include" "$nccl_dir/lib/libnccl.so."*
        -Xlinker -rpath="$nccl_dir/lib")
fi

build_cuda_plugin() {
  "$NVCC" -shared -std=c++20 -O3 -diag-suppress=2810 -Xcompiler -fPIC -I. "${cuda_inc[@]}" \
    -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
    -gencode=arch=compute_90,code=compute_90 \
    train/cuda/cuda_backend.cu common/status.cc "${cuda_libs[@]}" "${nccl[@]}" -o "$1"
}
