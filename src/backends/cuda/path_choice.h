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

// Runs, on `stream`, the path of `paths` chosen for `key`: each path enqueues one complete call of
// the op (all of them give the same result up to rounding). The first call for a key times every
// path as a captured graph runs it: each path runs once eagerly, is captured into a graph, and
// the graphs are replayed in turns with a cold L2 (a warm-up, then the best of 3). Their work is
// real, and the chosen path runs once more eagerly after. Inside a capture, or with
// LOCUS_PATH_AUTOTUNE=0, a key without a choice takes paths[0] untimed (and is not remembered
// while capturing). LOCUS_PATH_CHOICE_LOG=1 prints each timed choice to stderr.
void run_fastest_path(const std::string& key, const std::vector<std::function<void()>>& paths, cudaStream_t stream);

// The index chosen for `key`, -1 when none is (for tests and benchmarks).
int chosen_path(const std::string& key);

// Milliseconds of one call of `call` on `stream`: a warm-up, then the best of 3 (CUDA events),
// each run after twice the L2 was read through it, so that it reads its operands from memory as a
// decode step does (where that much memory is not free, the runs are timed warm). Its work is
// real. cuBLASLt's tactic choice times its candidates with it too.
float time_call_ms(const std::function<void()>& call, cudaStream_t stream);

// Whether `s` is being captured into a CUDA graph (then nothing may be timed or synchronized).
bool stream_capturing(cudaStream_t s);

}  // namespace locus::cuda::detail
