#include "common/launch_replay.h"

#include <cstdint>
#include <utility>

namespace hmla {

// One graph per (context, stream): an executable graph is ordered behind its own earlier launches,
// so sharing one between streams would make runs on different streams wait for each other.
struct LaunchReplay::Graphs {
  struct Entry {
    CUcontext context = nullptr;
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t nodes[detail::RecordedLaunches::kMaxLaunches] = {};
    uint64_t last_use = 0;
  };
  static constexpr int kEntries = 4;
  Entry entries[kEntries];
  uint64_t clock = 0;
  Stats stats;

  // Errors are ignored (and cleared): the graph may belong to a context already torn down.
  static void destroy(Entry& e) {
    if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
    if (e.graph != nullptr) cudaGraphDestroy(e.graph);
    if (e.exec != nullptr || e.graph != nullptr) cudaGetLastError();
    e = Entry{};
  }
  void clear() {
    for (Entry& e : entries) destroy(e);
  }
  ~Graphs() { clear(); }
};

LaunchReplay::LaunchReplay() : graphs_(std::make_unique<Graphs>()) {}
LaunchReplay::~LaunchReplay() = default;
LaunchReplay::LaunchReplay(LaunchReplay&&) noexcept = default;
LaunchReplay& LaunchReplay::operator=(LaunchReplay&&) noexcept = default;
void LaunchReplay::clear() {
  if (graphs_ != nullptr) graphs_->clear();
}
LaunchReplay::Stats LaunchReplay::stats() const { return graphs_ != nullptr ? graphs_->stats : Stats{}; }

namespace detail {
namespace {

using Graphs = LaunchReplay::Graphs;
constexpr int kNodes = RecordedLaunches::kMaxLaunches;

cudaKernelNodeParams node_params(const RecordedLaunches::Launch& launch) {
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(launch.function);  // a cudaKernel_t, which the graph API accepts
  p.gridDim = launch.grid;
  p.blockDim = launch.block;
  p.sharedMemBytes = static_cast<unsigned>(launch.smem_bytes);
  p.kernelParams = const_cast<void**>(launch.params);
  return p;
}

// The graph of a run: the attention kernel, then the combine behind a programmatic edge (the
// combine may start when every attention CTA has triggered it, as with the direct launches'
// programmatic stream serialisation), built with this run's parameters and instantiated.
bool build(Graphs::Entry& e, const cudaKernelNodeParams (&params)[kNodes]) {
  bool ok = cudaGraphCreate(&e.graph, 0) == cudaSuccess;
  for (int i = 0; ok && i < kNodes; ++i)
    ok = cudaGraphAddKernelNode(&e.nodes[i], e.graph, nullptr, 0, &params[i]) == cudaSuccess;
  for (int i = 1; ok && i < kNodes; ++i) {
    cudaGraphEdgeData edge{};
    edge.from_port = cudaGraphKernelNodePortProgrammatic;
    edge.type = cudaGraphDependencyTypeProgrammatic;
    ok = cudaGraphAddDependencies(e.graph, &e.nodes[i - 1], &e.nodes[i], &edge, 1) == cudaSuccess;
  }
  ok = ok && cudaGraphInstantiate(&e.exec, e.graph, 0) == cudaSuccess;
  if (!ok) Graphs::destroy(e);
  return ok;
}

// True when the held launches ran as the stream's graph; false (nothing launched, no error left
// behind) when they must be launched directly.
bool replay(Graphs& graphs, const RecordedLaunches& held) {
  cudaStream_t stream = held.stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;  // the caller's own graph takes the kernels
  CUcontext context = current_context();
  if (context == nullptr) return false;

  cudaKernelNodeParams params[kNodes];
  for (int i = 0; i < kNodes; ++i) params[i] = node_params(held.launch(i));
  Graphs::Entry* entry = nullptr;
  for (Graphs::Entry& e : graphs.entries)
    if (e.exec != nullptr && e.context == context && e.stream == stream) entry = &e;
  if (entry != nullptr) {
    bool ok = true;
    for (int i = 0; ok && i < kNodes; ++i)
      ok = cudaGraphExecKernelNodeSetParams(entry->exec, entry->nodes[i], &params[i]) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      Graphs::destroy(*entry);
      entry = nullptr;
    }
  }
  if (entry == nullptr) {
    entry = &graphs.entries[0];
    for (Graphs::Entry& e : graphs.entries)
      if (e.exec == nullptr || e.last_use < entry->last_use) entry = &e;
    Graphs::destroy(*entry);
    if (!build(*entry, params)) {
      cudaGetLastError();
      return false;
    }
    entry->context = context;
    entry->stream = stream;
    ++graphs.stats.graphs_built;
  }
  if (cudaGraphLaunch(entry->exec, stream) != cudaSuccess) {
    cudaGetLastError();
    Graphs::destroy(*entry);
    return false;
  }
  entry->last_use = ++graphs.clock;
  return true;
}

}  // namespace

ReplayedRun::ReplayedRun(LaunchReplay& replay, cudaStream_t stream)
    : graphs_(replay.graphs()), launches_(stream), previous_(set_recording_launches(&launches_)) {}

ReplayedRun::~ReplayedRun() { set_recording_launches(previous_); }

void ReplayedRun::submit() {
  set_recording_launches(previous_);
  if (launches_.count() == kNodes && graphs_ != nullptr && replay(*graphs_, launches_)) {
    launches_.forget();
    ++graphs_->stats.replayed;
    return;
  }
  if (graphs_ != nullptr) ++graphs_->stats.launched_directly;
  launches_.launch_held_directly();
}

}  // namespace detail
}  // namespace hmla
