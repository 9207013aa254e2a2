// Partitioned ops: validate the slices and shards up front, then fork, let each partition run the
// ordinary op on its shard into its output slice, and join.
#include "ops/partitioned.h"

#include <exception>
#include <functional>
#include <map>
#include <mutex>

#include "backends/cpu/thread_pool.h"
#include "core/error.h"
#include "ops/bmm.h"
#include "ops/gemm.h"

#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {

namespace {

// Rethrows a partition's exception; a locus::Error gets the partition named in front.
[[noreturn]] void rethrow_named(const std::exception_ptr& e, int p, int count) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    throw Error(str("partition ", p, " of ", count, ": ", err.what()));
  }
}

void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (size_t p = 0; p < errors.size(); ++p) {
    if (errors[p]) rethrow_named(errors[p], static_cast<int>(p), static_cast<int>(errors.size()));
  }
}

// CPU: the partitions run concurrently on a persistent fork pool of `count` threads (the caller
// is one of them), each partition's op on the worker pool its stream names. CPU ops are
// synchronous, so the fork has nothing to wait for and the join is the end of parallel_for.
// The pool is kept per partition count: starting threads on every call cost more than a small
// decode GEMM. With `count` threads every partition gets a thread of its own even while the
// others block (partitions may wait on each other), and a nested partitioned op on the same
// pool runs inline (ThreadPool's rule), so nesting cannot deadlock.
cpu::ThreadPool& fork_pool(int count) {
  static std::mutex mu;
  static std::map<int, cpu::ThreadPool*>* pools = new std::map<int, cpu::ThreadPool*>();  // leaked: see ThreadPool::global
  std::lock_guard<std::mutex> lock(mu);
  cpu::ThreadPool*& pool = (*pools)[count];
  if (!pool) pool = new cpu::ThreadPool(count);
  return *pool;
}

void run_cpu(const std::vector<Stream>& streams, const std::function<void(int)>& fn) {
  const int count = static_cast<int>(streams.size());
  std::vector<std::exception_ptr> errors(count);
  fork_pool(count).parallel_for(count, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      try {
        fn(static_cast<int>(p));
      } catch (...) {
        errors[p] = std::current_exception();
      }
    }
  });
  rethrow_first(errors);
}

#if defined(LOCUS_WITH_CUDA)
// CUDA: event fork from the caller's stream, enqueue every partition on its stream, event join
// back; all of it is capturable in a CUDA graph. The join happens even when an enqueue threw,
// so a capture stays well-formed before the error propagates. Partitions that run on the
// caller's own stream need no fork/join.
void run_cuda(const Stream& caller, const std::vector<Stream>& streams, const std::function<void(int)>& fn) {
  std::vector<void*> targets;
  for (const Stream& s : streams) {
    if (s.native != caller.native) targets.push_back(s.native);
  }
  cuda::fork_streams(caller.native, targets);
  std::vector<std::exception_ptr> errors(streams.size());
  for (size_t p = 0; p < streams.size(); ++p) {
    try {
      fn(static_cast<int>(p));
    } catch (...) {
      errors[p] = std::current_exception();
    }
  }
  cuda::join_streams(caller.native, targets);
  rethrow_first(errors);
}
#endif

// Slices must tile [0, extent) in order with non-empty ranges, one shard per slice.
void check_slices(const char* op, const std::vector<PartitionSlice>& slices, int64_t extent, size_t shard_count,
                  const char* extent_name) {
  LOCUS_CHECK(!slices.empty(), op, ": no partitions given");
  LOCUS_CHECK(slices.size() == shard_count, op, ": ", slices.size(), " slices but ", shard_count, " shards");
  int64_t expected = 0;
  for (size_t p = 0; p < slices.size(); ++p) {
    const PartitionSlice& s = slices[p];
    LOCUS_CHECK(s.n0 == expected, op, ": partition ", p, " starts at ", extent_name, " ", s.n0, " but ",
                p == 0 ? std::string("the first must start at 0") : str("partition ", p - 1, " ended at ", expected),
                " (slices must tile [0, ", extent, ") in order)");
    LOCUS_CHECK(s.n1 > s.n0, op, ": partition ", p, " has an empty range [", s.n0, ", ", s.n1, ")");
    expected = s.n1;
  }
  LOCUS_CHECK(expected == extent, op, ": the slices cover [0, ", expected, ") but the output has ", extent, " ",
              extent_name, "s");
}

Tensor bias_slice(const char* op, const Tensor& bias, int64_t n, int64_t n0, int64_t n1) {
  if (!bias.defined()) return {};
  LOCUS_CHECK(bias.dim() == 1 && bias.size(0) == n, op, ": bias must be [", n, "], got ", bias.describe());
  return bias.slice(0, n0, n1);
}

void check_output_2d(const char* op, const Tensor& x, const Tensor& y) {
  LOCUS_CHECK(x.defined() && x.dim() == 2, op, ": x must be a 2-D tensor, got ",
              x.defined() ? x.describe() : std::string("undefined"));
  LOCUS_CHECK(y.defined() && y.dim() == 2, op, ": y must be a 2-D tensor, got ",
              y.defined() ? y.describe() : std::string("undefined"));
  LOCUS_CHECK(y.size(0) == x.size(0), op, ": y has ", y.size(0), " rows but x has ", x.size(0));
}

void check_dense_shard(const char* op, size_t p, const Tensor& w, int64_t rows, int64_t k) {
  LOCUS_CHECK(w.defined() && w.dim() == 2, op, ": partition ", p, " shard must be a 2-D tensor, got ",
              w.defined() ? w.describe() : std::string("undefined"));
  LOCUS_CHECK(w.size(0) == rows && w.size(1) == k, op, ": partition ", p, " shard is ", w.shape_str(),
              " but its slice needs [", rows, ", ", k, "]");
}

void check_nvfp4_shard(const char* op, size_t p, const Nvfp4Weight& w, int64_t rows, int64_t k) {
  LOCUS_CHECK(w.n == rows && w.k == k, op, ": partition ", p, " shard is [", w.n, ", ", w.k,
              "] but its slice needs [", rows, ", ", k, "]");
}

// A CUDA partition without a stream of its own (a one-domain runtime's place: the device's
// default stream) runs on the caller's stream, so that it stays inside a graph capture.
Stream effective_stream(const Stream& caller, const Stream& s) {
  if (s.device.is_cuda() && s.native == nullptr && caller.native != nullptr) return Stream{s.device, caller.native};
  return s;
}

std::vector<Stream> streams_of(const std::vector<PartitionSlice>& slices, const Stream& caller) {
  std::vector<Stream> out;
  for (const auto& s : slices) out.push_back(effective_stream(caller, s.stream));
  return out;
}

// A fork/join from `origin` (caller's stream, or a stream a CUDA path choice times its paths on):
// what a one-launch path is timed against.
using ForkJoinFrom = std::function<void(void*)>;

// The partitioned op: `one_launch` (a CUDA single-launch path, handed the fork/join it may be
// timed against, from the origin stream it gives) where that takes the problem, else a fork from
// `caller` over the slices' streams, `per_partition(p, stream)` on each, and the join.
void fork_join_unless(const Stream& caller, const Device& device, const std::vector<PartitionSlice>& slices,
                      const std::function<void(int, const Stream&)>& per_partition,
                      const std::function<bool(const ForkJoinFrom&)>& one_launch) {
  auto fork_join = [&](const Stream& origin) {
    const std::vector<Stream> streams = streams_of(slices, origin);
    run_partitioned(origin, streams, [&](int p) { per_partition(p, streams[p]); });
  };
  const ForkJoinFrom from = [&](void* native) {
    fork_join(native == caller.native ? caller : Stream{device, native});
  };
  if (!one_launch(from)) fork_join(caller);
}

#if defined(LOCUS_WITH_CUDA)
// The single-launch locality-domain path (cuda_ops.h gemm_domains): taken for skinny activations
// on CUDA, where one domain-aware kernel beats a fork/join of one launch per partition.
std::vector<cuda::DomainSlice> domain_slices(const std::vector<PartitionSlice>& slices, const Stream& caller) {
  std::vector<cuda::DomainSlice> out;
  for (const auto& s : slices) out.push_back({s.n0, s.n1, effective_stream(caller, s.stream).native});
  return out;
}

bool cuda_bf16_domains(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                       bool swiglu, const std::vector<PartitionSlice>& slices, const Stream& caller) {
  if (!x.device().is_cuda() || x.size(0) > cuda::stream_gemm_bf16_max_m()) return false;
  return cuda::gemm_domains(x, shards, bias, y, swiglu, domain_slices(slices, caller), caller.native);
}

// The decode matrix-vector kernel's one-launch form, where it takes the problem and is timed
// faster than `fork_join`.
bool cuda_bf16_gemv_domains(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                            bool swiglu, const std::vector<PartitionSlice>& slices, const Stream& caller,
                            const ForkJoinFrom& fork_join) {
  if (!x.device().is_cuda()) return false;
  const std::vector<cuda::DomainSlice> domains = domain_slices(slices, caller);
  return swiglu ? cuda::gemm_swiglu_partitioned_fastest(x, shards, y, domains, caller.native, fork_join)
                : cuda::gemm_partitioned_fastest(x, shards, bias, y, domains, caller.native, fork_join);
}

// At decode M the faster, timed once, of the streaming kernel's one launch and `fork_join` (whose
// per-partition ops time the matrix-vector kernel); above, that launch where it applies.
bool cuda_nvfp4_domains(const Tensor& x, const std::vector<Nvfp4Weight>& shards, const Tensor& bias, const Tensor& y,
                        bool swiglu, const std::vector<PartitionSlice>& slices, const Stream& caller,
                        const ForkJoinFrom& fork_join) {
  if (!x.device().is_cuda()) return false;
  const std::vector<cuda::DomainSlice> domains = domain_slices(slices, caller);
  return cuda::nvfp4_gemm_partitioned_fastest(x, shards, bias, y, swiglu, domains, caller.native, fork_join) ||
         cuda::nvfp4_gemm_domains(x, shards, bias, y, swiglu, domains, caller.native);
}

// The BMM's one-launch form, where one applies: the TMA kernel's (or the fork/join, if timed
// faster), else the streaming kernel's when LOCUS_STREAM_GEMM_BF16_MAX_M admits M.
bool cuda_bmm_domains(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                      const std::vector<PartitionSlice>& slices, const Stream& caller,
                      const ForkJoinFrom& fork_join) {
  if (!a.device().is_cuda()) return false;
  const std::vector<cuda::DomainSlice> domains = domain_slices(slices, caller);
  if (cuda::bmm_partitioned_fastest(a, b_shards, y, domains, caller.native, fork_join)) return true;
  return a.size(1) <= cuda::stream_gemm_bf16_max_m() && cuda::bmm_domains(a, b_shards, y, domains, caller.native);
}
#else
bool cuda_bf16_domains(const Tensor&, const std::vector<Tensor>&, const Tensor&, const Tensor&, bool,
                       const std::vector<PartitionSlice>&, const Stream&) {
  return false;
}
bool cuda_bf16_gemv_domains(const Tensor&, const std::vector<Tensor>&, const Tensor&, const Tensor&, bool,
                            const std::vector<PartitionSlice>&, const Stream&, const ForkJoinFrom&) {
  return false;
}
bool cuda_nvfp4_domains(const Tensor&, const std::vector<Nvfp4Weight>&, const Tensor&, const Tensor&, bool,
                        const std::vector<PartitionSlice>&, const Stream&, const ForkJoinFrom&) {
  return false;
}
bool cuda_bmm_domains(const Tensor&, const std::vector<Tensor>&, const Tensor&, const std::vector<PartitionSlice>&,
                      const Stream&, const ForkJoinFrom&) {
  return false;
}
#endif

}  // namespace

void run_partitioned(const Stream& caller, const std::vector<Stream>& streams, const std::function<void(int)>& fn) {
  LOCUS_CHECK(!streams.empty(), "run_partitioned: no partition streams given");
  const DeviceType type = streams[0].device.type;
  for (size_t p = 1; p < streams.size(); ++p) {
    LOCUS_CHECK(streams[p].device.type == type && streams[p].device.index == streams[0].device.index,
                "run_partitioned: partition ", p, " runs on ", streams[p].device.name(), " but partition 0 on ",
                streams[0].device.name());
  }
  if (type == DeviceType::kCPU) {
    LOCUS_CHECK(caller.device.is_cpu() || caller.native == nullptr, "run_partitioned: caller stream is on ",
                caller.device.name(), " but the partitions run on the CPU");
    if (streams.size() == 1) {
      try {
        fn(0);
      } catch (const Error&) {
        rethrow_named(std::current_exception(), 0, 1);
      }
      return;
    }
    run_cpu(streams, fn);
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  // Stream{} (the CPU-typed default) as caller means the device's legacy default stream.
  LOCUS_CHECK(caller.native == nullptr || caller.device == streams[0].device, "run_partitioned: caller stream is on ",
              caller.device.name(), " but the partitions run on ", streams[0].device.name());
  run_cuda(caller, streams, fn);
#else
  LOCUS_THROW("run_partitioned: partitions on ", streams[0].device.name(),
              " need the CUDA backend, which this build does not have");
#endif
}

void gemm_partitioned(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                      const std::vector<PartitionSlice>& slices, const Stream& caller) {
  const char* op = "gemm_partitioned";
  check_output_2d(op, x, y);
  check_slices(op, slices, y.size(1), shards.size(), "column");
  for (size_t p = 0; p < slices.size(); ++p) check_dense_shard(op, p, shards[p], slices[p].n1 - slices[p].n0, x.size(1));
  if (bias.defined()) bias_slice(op, bias, y.size(1), 0, y.size(1));  // validates the shape before the fork
  if (cuda_bf16_domains(x, shards, bias, y, false, slices, caller)) return;
  fork_join_unless(
      caller, x.device(), slices,
      [&](int p, const Stream& s) {
        const PartitionSlice& sl = slices[p];
        gemm(x, shards[p], bias_slice(op, bias, y.size(1), sl.n0, sl.n1), y.slice(1, sl.n0, sl.n1), s);
      },
      [&](const ForkJoinFrom& fj) { return cuda_bf16_gemv_domains(x, shards, bias, y, false, slices, caller, fj); });
}

void gemm_swiglu_partitioned(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& y,
                             const std::vector<PartitionSlice>& slices, const Stream& caller) {
  const char* op = "gemm_swiglu_partitioned";
  check_output_2d(op, x, y);
  check_slices(op, slices, y.size(1), shards.size(), "column");
  for (size_t p = 0; p < slices.size(); ++p) {
    check_dense_shard(op, p, shards[p], 2 * (slices[p].n1 - slices[p].n0), x.size(1));  // [gate rows; up rows]
  }
  if (cuda_bf16_domains(x, shards, Tensor(), y, true, slices, caller)) return;
  fork_join_unless(
      caller, x.device(), slices,
      [&](int p, const Stream& s) { gemm_swiglu(x, shards[p], y.slice(1, slices[p].n0, slices[p].n1), s); },
      [&](const ForkJoinFrom& fj) { return cuda_bf16_gemv_domains(x, shards, Tensor(), y, true, slices, caller, fj); });
}

void nvfp4_gemm_partitioned(const Tensor& x, const std::vector<Nvfp4Weight>& shards, const Tensor& bias,
                            const Tensor& y, const std::vector<PartitionSlice>& slices, const Stream& caller) {
  const char* op = "nvfp4_gemm_partitioned";
  check_output_2d(op, x, y);
  check_slices(op, slices, y.size(1), shards.size(), "column");
  for (size_t p = 0; p < slices.size(); ++p) check_nvfp4_shard(op, p, shards[p], slices[p].n1 - slices[p].n0, x.size(1));
  if (bias.defined()) bias_slice(op, bias, y.size(1), 0, y.size(1));
  fork_join_unless(
      caller, x.device(), slices,
      [&](int p, const Stream& s) {
        const PartitionSlice& sl = slices[p];
        nvfp4_gemm(x, shards[p], bias_slice(op, bias, y.size(1), sl.n0, sl.n1), y.slice(1, sl.n0, sl.n1), s);
      },
      [&](const ForkJoinFrom& fj) { return cuda_nvfp4_domains(x, shards, bias, y, false, slices, caller, fj); });
}

void nvfp4_gemm_swiglu_partitioned(const Tensor& x, const std::vector<Nvfp4Weight>& shards, const Tensor& y,
                                   const std::vector<PartitionSlice>& slices, const Stream& caller) {
  const char* op = "nvfp4_gemm_swiglu_partitioned";
  check_output_2d(op, x, y);
  check_slices(op, slices, y.size(1), shards.size(), "column");
  for (size_t p = 0; p < slices.size(); ++p) {
    check_nvfp4_shard(op, p, shards[p], 2 * (slices[p].n1 - slices[p].n0), x.size(1));
  }
  fork_join_unless(
      caller, x.device(), slices,
      [&](int p, const Stream& s) { nvfp4_gemm_swiglu(x, shards[p], y.slice(1, slices[p].n0, slices[p].n1), s); },
      [&](const ForkJoinFrom& fj) { return cuda_nvfp4_domains(x, shards, Tensor(), y, true, slices, caller, fj); });
}

void bmm_partitioned(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                     const std::vector<PartitionSlice>& slices, const Stream& caller) {
  const char* op = "bmm_partitioned";
  LOCUS_CHECK(a.defined() && a.dim() == 3, op, ": a must be a 3-D tensor [B, M, K], got ",
              a.defined() ? a.describe() : std::string("undefined"));
  LOCUS_CHECK(y.defined() && y.dim() == 3, op, ": y must be a 3-D tensor [B, M, N], got ",
              y.defined() ? y.describe() : std::string("undefined"));
  LOCUS_CHECK(y.size(0) == a.size(0) && y.size(1) == a.size(1), op, ": y is ", y.shape_str(), " but a is ",
              a.shape_str(), " (batch and M must match)");
  check_slices(op, slices, a.size(0), b_shards.size(), "head");
  for (size_t p = 0; p < slices.size(); ++p) {
    const Tensor& b = b_shards[p];
    const int64_t heads = slices[p].n1 - slices[p].n0;
    LOCUS_CHECK(b.defined() && b.dim() == 3, op, ": partition ", p, " shard must be a 3-D tensor [B, K, N], got ",
                b.defined() ? b.describe() : std::string("undefined"));
    LOCUS_CHECK(b.size(0) == heads && b.size(1) == a.size(2) && b.size(2) == y.size(2), op, ": partition ", p,
                " shard is ", b.shape_str(), " but its slice needs [", heads, ", ", a.size(2), ", ", y.size(2), "]");
  }
  fork_join_unless(
      caller, a.device(), slices,
      [&](int p, const Stream& s) {
        const PartitionSlice& sl = slices[p];
        bmm(a.slice(0, sl.n0, sl.n1), b_shards[p], y.slice(0, sl.n0, sl.n1), s);
      },
      [&](const ForkJoinFrom& fj) { return cuda_bmm_domains(a, b_shards, y, slices, caller, fj); });
}

}  // namespace locus::ops
