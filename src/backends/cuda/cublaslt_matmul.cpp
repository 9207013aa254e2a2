#include "backends/cuda/cublaslt_matmul.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_registry.h"

#define LOCUS_CUBLAS_CHECK(call)                                                             \
  do {                                                                                       \
    cublasStatus_t locus_st_ = (call);                                                       \
    if (locus_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      LOCUS_THROW("cuBLASLt call ", #call, " failed with status ", static_cast<int>(locus_st_)); \
  } while (0)

namespace locus::cuda::detail {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS' recommendation for Hopper

// Runs `fn` with the calling thread's capture mode relaxed, so that one-time allocations
// (workspaces) are legal even when the first use happens inside a capture.
template <typename Fn>
void relaxed(Fn&& fn) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  LOCUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  try {
    fn();
  } catch (...) {
    cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
}

struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;  // (device, stream) -> 32 MiB
  std::map<std::string, cublasLtMatmulAlgo_t> tactics;
};

LtState& state() {
  static auto* s = new LtState();  // never destroyed (handles outlive static teardown)
  return *s;
}

cublasLtHandle_t handle_locked(LtState& s) {
  if (!s.handle) relaxed([&] { LOCUS_CUBLAS_CHECK(cublasLtCreate(&s.handle)); });
  return s.handle;
}

void* workspace_locked(LtState& s, cudaStream_t stream) {
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  auto key = std::make_pair(dev, stream);
  auto it = s.workspaces.find(key);
  if (it != s.workspaces.end()) return it->second;
  void* p = nullptr;
  relaxed([&] { LOCUS_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes)); });
  s.workspaces[key] = p;
  return p;
}

int alignment_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  LOCUS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

bool autotune_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LOCUS_CUBLASLT_AUTOTUNE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// RAII for the descriptor objects of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* out, cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  LOCUS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(out, t, rows, cols, ld));
  if (batch > 1) {
    int32_t b = static_cast<int32_t>(batch);
    LOCUS_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
    LOCUS_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
}

// alpha/beta arguments in the descriptor's pointer mode: host 1 and 0, or the device alpha and a
// device zero.
struct Scalars {
  const void* alpha;
  const void* beta;
};

const float* device_zero() {
  static const float* z = static_cast<const float*>(persistent_device_alloc(sizeof(float), nullptr, "allocating cuBLASLt's device beta"));
  return z;
}

Scalars scalars(const LtMatmul& mm) {
  static const float one = 1.f, zero = 0.f;
  if (mm.alpha_device) return {mm.alpha_device, device_zero()};
  return {&one, &zero};
}

float time_algo(cublasLtHandle_t h, const Descs& ds, const cublasLtMatmulAlgo_t& algo, const LtMatmul& mm,
                void* ws, cudaStream_t stream) {
  const Scalars sc = scalars(mm);
  cudaEvent_t e0, e1;
  LOCUS_CUDA_CHECK(cudaEventCreate(&e0));
  LOCUS_CUDA_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  bool ok = true;
  for (int rep = 0; rep < 4 && ok; ++rep) {
    cudaEventRecord(e0, stream);
    ok = cublasLtMatmul(h, ds.op, sc.alpha, mm.a, ds.a, mm.b, ds.b, sc.beta, mm.d, ds.d, mm.d, ds.d, &algo, ws,
                        kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) best = std::min(best, ms);  // the first run is a warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ok ? best : 1e30f;
}

}  // namespace

void* scratch_alloc(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  LOCUS_CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 16, stream));
  return p;
}

void scratch_free(void* p, cudaStream_t stream) {
  if (p) LOCUS_CUDA_CHECK(cudaFreeAsync(p, stream));
}

size_t tactic_cache_size() {
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.tactics.size();
}

void lt_matmul(const LtMatmul& mm, cudaStream_t stream) {
  if (mm.m == 0 || mm.n == 0 || mm.batch == 0) return;
  LOCUS_CHECK(mm.k > 0, "cuBLASLt matmul with K = 0 is not supported");
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  cublasLtHandle_t h = handle_locked(s);
  void* ws = workspace_locked(s, stream);

  Descs ds;
  const cudaDataType dt = mm.d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (mm.alpha_device) {
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  }
  // (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = the partition's SMs was tried on the H200 on
  // 2026-12-02: slower at M = 512 and an execution failure at M = 4096 on a green-context stream.)
  const int sm_part = partition_stream_sm_count(stream);
  if (mm.bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias, sizeof(void*)));
    cudaDataType bt = mm.bias_f32 ? CUDA_R_32F : CUDA_R_16BF;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  make_layout(&ds.a, CUDA_R_16BF, mm.trans_a ? mm.k : mm.m, mm.trans_a ? mm.m : mm.k, mm.lda, mm.batch, mm.stride_a);
  make_layout(&ds.b, CUDA_R_16BF, mm.trans_b ? mm.n : mm.k, mm.trans_b ? mm.k : mm.n, mm.ldb, mm.batch, mm.stride_b);
  make_layout(&ds.d, dt, mm.m, mm.n, mm.ldd, mm.batch, mm.stride_d);

  const int al_a = alignment_of(mm.a), al_b = alignment_of(mm.b), al_d = alignment_of(mm.d);
  const int al_bias = mm.bias ? alignment_of(mm.bias) : 256;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds.pref));
  size_t wsb = kWorkspaceBytes;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  uint32_t u;
  u = al_a; cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &u, sizeof(u));
  u = al_b; cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &u, sizeof(u));
  u = al_d; cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &u, sizeof(u));
  cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &u, sizeof(u));

  const std::string key =
      str(mm.trans_a, mm.trans_b, ':', mm.m, 'x', mm.n, 'x', mm.k, ':', mm.lda, ',', mm.ldb, ',', mm.ldd, ':', mm.batch,
          ',', mm.stride_a, ',', mm.stride_b, ',', mm.stride_d, ':', mm.d_f32, ':', mm.bias != nullptr, mm.bias_f32, ':',
          al_a, ',', al_b, ',', al_d, ',', al_bias, ":sm", sm_part, ':', mm.alpha_device != nullptr);

  auto it = s.tactics.find(key);
  if (it == s.tactics.end()) {
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int found = 0;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, kCandidates, res, &found));
    LOCUS_CHECK(found > 0, "cuBLASLt has no algorithm for the matmul ", key);
    int best = 0;
    // Timing runs real work on the stream, so it happens only outside a capture; inside one the
    // heuristic's first choice is taken and cached, so later calls stay deterministic.
    if (found > 1 && autotune_enabled() && !stream_capturing(stream)) {
      float best_ms = 1e30f;
      for (int i = 0; i < found; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        float ms = time_algo(h, ds, res[i].algo, mm, ws, stream);
        if (ms < best_ms) {
          best_ms = ms;
          best = i;
        }
      }
      cudaGetLastError();
    }
    it = s.tactics.emplace(key, res[best].algo).first;
  }
  const Scalars sc = scalars(mm);
  LOCUS_CUBLAS_CHECK(cublasLtMatmul(h, ds.op, sc.alpha, mm.a, ds.a, mm.b, ds.b, sc.beta, mm.d, ds.d, mm.d, ds.d,
                                    &it->second, ws, kWorkspaceBytes, stream));
}

}  // namespace locus::cuda::detail
