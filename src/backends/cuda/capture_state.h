// Internal to the CUDA backend: whether a CUDA graph capture (cuda::Graph) is in progress in this
// process, and the device blocks a captured graph keeps. The allocator neither waits for the
// device nor frees memory while a capture is in progress: both would break the capture.
//
// A captured graph replays the addresses it was captured with. So a block handed out by the
// allocator during a capture and freed before the capture ends (an op's scratch) is not given back
// to the cache: it may serve later requests of the same capture, and then cuda::Graph holds it
// until the graph is destroyed. Blocks still live when the capture ends (the step's outputs)
// belong to their tensors, which the graph's owner keeps as long as the graph. One capture at a
// time: a capture inside another shares its blocks. (capture_blocks.cpp)
#pragma once
#include <cstddef>
#include <vector>

namespace locus::cuda::detail {

void capture_started();
// Ends the capture; returns the blocks allocated and freed during it (the graph's to hold).
std::vector<void*> capture_ended();
bool capture_in_progress();
// The allocator's side, while a capture is in progress: a block freed during it of this size
// class, device and domain, handed out again (nullptr when none); every new block it hands out;
// and, for every block freed, whether the capture keeps it (true) rather than the cache.
void* reuse_capture_block(size_t size_class, int device, int domain);
void note_capture_allocation(void* p, size_t size_class, int device, int domain);
bool keep_for_capture(void* p);
// Gives blocks from capture_ended() back to the allocator's cache (their graph is gone).
void release_capture_blocks(std::vector<void*>& blocks);

}  // namespace locus::cuda::detail
