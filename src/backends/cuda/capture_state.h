// Internal to the CUDA backend: whether a CUDA graph capture (cuda::Graph) is in progress in this
// process. The allocator neither waits for the device nor frees memory while one is: both would
// break the capture.
#pragma once

namespace locus::cuda::detail {

void capture_started();
void capture_ended();
bool capture_in_progress();

}  // namespace locus::cuda::detail
