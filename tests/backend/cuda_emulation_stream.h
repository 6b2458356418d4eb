// The emulated stream, shared by the kernels' launches (cuda_emulation.h) and the runtime's
// copies and GEMMs (cuda_emulated_runtime.cpp): work runs at once, except while the stream is
// captured (CUDA graphs), when it is recorded in order and launching the graph runs the recording.
// As on a GPU, recorded work keeps the arguments it was queued with and reads memory when the
// graph runs.
#pragma once
#include <functional>
#include <vector>

namespace emu {

inline std::vector<std::function<void()>> *g_recording; // the open capture's, else null

inline void stream_work(std::function<void()> work) {
    if (g_recording) g_recording->push_back(std::move(work));
    else work();
}

} // namespace emu
