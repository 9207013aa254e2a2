#include "backends/cuda/cublaslt_matmul.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/path_choice.h"
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

// A cached choice: the algorithm, and the SM count its descriptor targets (0: the whole device).
struct Tactic {
  cublasLtMatmulAlgo_t algo;
  int32_t sm_target = 0;
};

// Per (device, stream): each partition stream gets its own handle and workspace.
struct StreamLt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // 32 MiB
};

// RAII for the descriptor objects of a matmul.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descs() = default;
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// What decides a matmul's tactic and descriptors (lt_matmul's cache key): transposes, shape,
// leading dimensions, batch strides, dtypes, bias, the operands' alignments, the partition's SM
// count and the alpha's pointer mode. Numbers, so a call builds no string.
using MatmulKey = std::array<int64_t, 21>;

// A cached choice and the descriptors made for it, reused by every call with its key (only the
// bias pointer, which the key leaves out, is set per call).
struct CachedMatmul {
  Tactic tactic;
  std::unique_ptr<Descs> descs;
};

struct LtState {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, StreamLt> streams;
  std::map<MatmulKey, CachedMatmul> matmuls;
};

LtState& state() {
  static auto* s = new LtState();  // never destroyed (handles outlive static teardown)
  return *s;
}

// The stream's handle and workspace, made on its first matmul (kept for the process: a captured
// graph may still use the workspace after the stream is gone).
const StreamLt& stream_lt_locked(LtState& s, cudaStream_t stream) {
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = s.streams.find({dev, stream});
  if (it != s.streams.end()) return it->second;
  StreamLt lt;
  relaxed([&] {
    LOCUS_CUDA_CHECK(cudaMalloc(&lt.workspace, kWorkspaceBytes));
    LOCUS_CUBLAS_CHECK(cublasLtCreate(&lt.handle));
  });
  return s.streams.emplace(std::make_pair(dev, stream), lt).first->second;
}

int alignment_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

// The key as text, for messages and the tactic log.
std::string describe(const MatmulKey& k) {
  std::string out = "matmul";
  for (size_t i = 0; i < k.size(); ++i) out += str(i ? "," : " ", k[i]);
  return out;
}

bool autotune_enabled() {
  static const bool on = env_switch("LOCUS_CUBLASLT_AUTOTUNE");
  return on;
}

// LOCUS_CUBLASLT_SM_TARGET=0 leaves out the candidates aimed at a partition's SM count.
bool sm_target_candidates() {
  static const bool on = env_switch("LOCUS_CUBLASLT_SM_TARGET");
  return on;
}

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

// The descriptors of `mm`, its heuristic aimed at `sm_target` SMs (0: the whole device).
void make_descs(const LtMatmul& mm, int32_t sm_target, Descs* ds) {
  const cudaDataType dt = mm.d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (mm.alpha_device) {
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  }
  if (sm_target > 0) {
    LOCUS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof(sm_target)));
  }
  if (mm.bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias, sizeof(void*)));
    cudaDataType bt = mm.bias_f32 ? CUDA_R_32F : CUDA_R_16BF;
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  make_layout(&ds->a, CUDA_R_16BF, mm.trans_a ? mm.k : mm.m, mm.trans_a ? mm.m : mm.k, mm.lda, mm.batch, mm.stride_a);
  make_layout(&ds->b, CUDA_R_16BF, mm.trans_b ? mm.n : mm.k, mm.trans_b ? mm.k : mm.n, mm.ldb, mm.batch, mm.stride_b);
  make_layout(&ds->d, dt, mm.m, mm.n, mm.ldd, mm.batch, mm.stride_d);
  LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds->pref));
  size_t wsb = kWorkspaceBytes;
  LOCUS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  uint32_t u;
  u = alignment_of(mm.a); cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &u, sizeof(u));
  u = alignment_of(mm.b); cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &u, sizeof(u));
  u = alignment_of(mm.d); cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &u, sizeof(u));
  cublasLtMatmulPreferenceSetAttribute(ds->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &u, sizeof(u));
}

cublasStatus_t run(const StreamLt& lt, const Descs& ds, const cublasLtMatmulAlgo_t& algo, const LtMatmul& mm,
                   cudaStream_t stream) {
  const Scalars sc = scalars(mm);
  return cublasLtMatmul(lt.handle, ds.op, sc.alpha, mm.a, ds.a, mm.b, ds.b, sc.beta, mm.d, ds.d, mm.d, ds.d, &algo,
                        lt.workspace, kWorkspaceBytes, stream);
}

// Milliseconds of one call with each of `cands`, timed as a decode step's graph runs them
// (time_in_graphs_ms; LOCUS_CUBLASLT_GRAPH_TIMING=0: eagerly, time_eagerly_ms); 1e30 for one that
// fails.
std::vector<float> time_tactics(const StreamLt& lt, const std::vector<Tactic>& cands, const LtMatmul& mm,
                                cudaStream_t stream) {
  std::vector<Descs> descs(cands.size());
  std::vector<char> ok(cands.size(), 1);
  std::vector<PathCall> calls;
  for (size_t i = 0; i < cands.size(); ++i) {
    make_descs(mm, cands[i].sm_target, &descs[i]);
    calls.push_back([&, i](cudaStream_t s) {
      if (ok[i] && run(lt, descs[i], cands[i].algo, mm, s) != CUBLAS_STATUS_SUCCESS) ok[i] = 0;
    });
  }
  static EnvToggle in_graphs("LOCUS_CUBLASLT_GRAPH_TIMING", /*default_on=*/true);
  std::vector<float> ms = in_graphs.on() ? time_in_graphs_ms(calls, stream) : time_eagerly_ms(calls, stream);
  cudaGetLastError();  // a candidate that failed to launch leaves its error behind
  for (size_t i = 0; i < cands.size(); ++i)
    if (!ok[i]) ms[i] = 1e30f;
  return ms;
}

// An algorithm's K split and reduction scheme (cublasLtReductionScheme_t), for the choice log.
std::string split_k_of(const cublasLtMatmulAlgo_t& algo) {
  int32_t split_k = 0, reduction = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof(split_k), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction),
                                       &written);
  return str("split-K ", split_k, ", reduction ", reduction);
}

// The heuristic's candidates for the whole device and, on a partition stream (`sm_part` > 0), for
// the partition's SM count too: cuBLASLt does not see a green context's SMs, and its whole-device
// picks can take as long on half the SMs as on all of them. The fastest in a graph is taken
// (outside a capture: timing runs real work on the stream); inside one the whole-device
// heuristic's first choice is taken, so later calls stay deterministic.
Tactic choose_tactic(const StreamLt& lt, const LtMatmul& mm, int sm_part, cudaStream_t stream, const std::string& key) {
  constexpr int kCandidates = 8;
  std::vector<Tactic> cands;
  std::vector<int32_t> targets = {0};
  if (sm_part > 0 && sm_target_candidates()) targets.push_back(sm_part);
  for (int32_t target : targets) {
    Descs ds;
    make_descs(mm, target, &ds);
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt.handle, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, kCandidates, res, &found) !=
        CUBLAS_STATUS_SUCCESS)
      found = 0;
    for (int i = 0; i < found; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) cands.push_back({res[i].algo, target});
  }
  LOCUS_CHECK(!cands.empty(), "cuBLASLt has no algorithm for the matmul ", key);
  if (cands.size() == 1 || !autotune_enabled() || stream_capturing(stream)) return cands[0];
  const std::vector<float> ms = time_tactics(lt, cands, mm, stream);
  const size_t pick = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  if (log_choices()) {
    std::string times;
    for (size_t i = 0; i < cands.size(); ++i)
      times += str(i ? ", " : "", ms[i] * 1e3f, " us (", split_k_of(cands[i].algo), ")");
    std::fprintf(stderr, "locus: cuBLASLt tactic %s: %s -> %zu\n", key.c_str(), times.c_str(), pick);
  }
  return cands[pick];
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
  return s.matmuls.size();
}

void lt_matmul(const LtMatmul& mm, cudaStream_t stream) {
  if (mm.m == 0 || mm.n == 0 || mm.batch == 0) return;
  LOCUS_CHECK(mm.k > 0, "cuBLASLt matmul with K = 0 is not supported");
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const StreamLt& lt = stream_lt_locked(s, stream);
  const int sm_part = partition_stream_sm_count(stream);
  const MatmulKey key = {mm.trans_a,         mm.trans_b,         mm.m,
                         mm.n,               mm.k,               mm.lda,
                         mm.ldb,             mm.ldd,             mm.batch,
                         mm.stride_a,        mm.stride_b,        mm.stride_d,
                         mm.d_f32,           mm.bias != nullptr, mm.bias_f32,
                         alignment_of(mm.a), alignment_of(mm.b), alignment_of(mm.d),
                         mm.bias ? alignment_of(mm.bias) : 256, sm_part, mm.alpha_device != nullptr};
  auto it = s.matmuls.find(key);
  if (it == s.matmuls.end()) {
    CachedMatmul c;
    c.tactic = choose_tactic(lt, mm, sm_part, stream, describe(key));
    c.descs = std::make_unique<Descs>();
    make_descs(mm, c.tactic.sm_target, c.descs.get());
    it = s.matmuls.emplace(key, std::move(c)).first;
  } else if (mm.bias) {
    // The one call-specific attribute (make_descs set it for the first call).
    LOCUS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(it->second.descs->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &mm.bias, sizeof(void*)));
  }
  LOCUS_CUBLAS_CHECK(run(lt, *it->second.descs, it->second.tactic.algo, mm, stream));
}

}  // namespace locus::cuda::detail
