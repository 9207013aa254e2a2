// Internal to the CUDA backend: the choice between whole code paths of one op (a kernel of ours,
// cuBLASLt calls, a fork/join over partition streams), made by timing each path once per problem
// and remembered, as cuBLASLt's algorithms are (cublaslt_matmul.h). After the first call the
// choice never changes, so repeated calls and graph replays compute the same way.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace locus::cuda::detail {

// One complete call of an op by one path, enqueued on the stream it is given.
using PathCall = std::function<void(cudaStream_t)>;

// Runs, on `stream`, the path of `paths` chosen for `key` (all of them give the same result up to
// rounding). The first call for a key times every path as a captured decode step runs it: each
// path runs once eagerly, then is captured into a graph behind a read of twice the L2 (so that it
// reads its operands from memory, and its first kernel follows a kernel, as in a step; the read
// does not let that kernel start early, as our GEMM kernels would); the graphs and one of the read
// alone are replayed in turns (a warm-up, then the best of 7), and a path's time is its graph's
// less the read's. The timing runs on a stream of its own, ordered after `stream` and
// `stream` after it, when `stream` is a default stream (those cannot be captured). Their work is
// real, and the chosen path runs once more eagerly after. Inside a capture, or with
// LOCUS_PATH_AUTOTUNE=0, a key without a choice takes paths[0] untimed (and is not remembered
// while capturing). LOCUS_PATH_CHOICE_LOG=1 prints each timed choice to stderr.
void run_fastest_path(const std::string& key, const std::vector<PathCall>& paths, cudaStream_t stream);

// The index chosen for `key`, -1 when none is (for tests and benchmarks).
int chosen_path(const std::string& key);

// Milliseconds of one call of each of `paths` as run_fastest_path times them (captured behind a
// read of twice the L2, less the read alone), on `stream` or, for a default stream, a stream of its
// own ordered with it. cuBLASLt's tactic choice times its candidates with it: a decode step is a
// graph, where a candidate's extra nodes (a memset before a split-K kernel) cost more than eagerly.
std::vector<float> time_in_graphs_ms(const std::vector<PathCall>& paths, cudaStream_t stream);
// The same, each call run eagerly after twice the L2 was read (4 rounds, the calls taking turns;
// per call the best after the first round).
std::vector<float> time_eagerly_ms(const std::vector<PathCall>& paths, cudaStream_t stream);

// LOCUS_PATH_CHOICE_LOG=1: each timed choice (of a path, of a cuBLASLt tactic) is printed to
// stderr with each candidate's time and the pick.
bool log_choices();

// Whether `s` is being captured into a CUDA graph (then nothing may be timed or synchronized).
bool stream_capturing(cudaStream_t s);

}  // namespace locus::cuda::detail
