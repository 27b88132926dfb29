// A run entry point's kernels replayed as a CUDA graph, for callers that launch eagerly (no graph
// capture of their own) and whose decoding step is bound by host time.
//
//   hmla::LaunchReplay replay;                       // one per host thread, kept across steps
//   for (layer ...) hmla::sparse_decode_run(params_of_layer, schedule, stream, replay);
//
// A run launches two kernels (the attention and the combine of split requests); two launches cost
// ~5.9 us of host time on an H100 host, one replay of an instantiated two-node graph with both
// nodes' parameters updated ~2.9 us (hmla-host-overhead, docs/PYTHON.md "Measured overhead"). The
// first run on a stream builds and instantiates that graph (tens of microseconds, once); later runs
// update its nodes with the call's kernels, grids and arguments and launch it. The graph keeps the
// programmatic edge between the two kernels; the attention kernel does not overlap the tail of the
// kernel before it on the stream, as it does when launched directly.
//
// Runs on a stream that is being captured into the caller's own graph, on the legacy default stream
// while another stream captures, or whose replay fails for any reason, launch directly, as the
// overloads without a LaunchReplay do; the results are the same either way.
//
// One LaunchReplay must not be used by two threads at once. It holds one graph per (CUDA context,
// stream) it has run on, up to four (the least recently used goes first); destroy it (or call
// clear()) before cudaDeviceReset of a device it ran on. Two runs on different streams never wait
// for each other through it.
#pragma once

#include <memory>

namespace hmla {

class LaunchReplay {
 public:
  LaunchReplay();
  ~LaunchReplay();
  LaunchReplay(const LaunchReplay&) = delete;
  LaunchReplay& operator=(const LaunchReplay&) = delete;
  LaunchReplay(LaunchReplay&&) noexcept;
  LaunchReplay& operator=(LaunchReplay&&) noexcept;

  // Destroys the graphs held so far; the next run on each stream builds its graph again.
  void clear();

  // What the runs given this object did: replayed as a graph (the first on a stream included),
  // launched directly instead (capture, failure), and graphs built and instantiated.
  struct Stats {
    unsigned long long replayed = 0, launched_directly = 0, graphs_built = 0;
  };
  Stats stats() const;

  struct Graphs;  // src/common/launch_replay.cpp; null once moved from (runs then launch directly)
  Graphs* graphs() const { return graphs_.get(); }

 private:
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace hmla
