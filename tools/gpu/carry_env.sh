# Sourced by the GPU machine's scripts (from the repository root): CARRY, the folder of binaries
# that tools/gpu/package.sh builds, and a library path that finds its libraries, the CUDA
# toolkit's and the device's cuBLAS (wherever that machine keeps libcublasLt.so.13).
CARRY=.gpu-carry
CUDA_LIBS=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/$CARRY:/usr/local/cuda/lib64:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
