// tfe::DraftBroadcast: drafts to every rank of a tensor-parallel engine, through NCCL.
//
// The head runs on rank 0 only (a tfe::Runtime there). After each draft, rank 0's tokens and confidences
// go to every rank in one NCCL group of two broadcasts on the caller's stream, into device buffers each
// rank owns; rank 0 broadcasts in place from its runtime's outputs. Ranks other than 0 hold nothing but
// those buffers: no weights, no kernels, no Runtime. Like Runtime::draft_async, a broadcast only enqueues
// and can be recorded into the caller's stream capture. Extends run on rank 0 only: the taps a TP engine
// hands rank 0 are full-width rows, which every rank holds after each all-reduce (docs/distributed.md).
//
// Failure: a rank that dies leaves the others' broadcast waiting in its kernel forever. wait() bounds it:
// it polls the stream and the communicator's asynchronous error, and at an error or past `timeout` it aborts
// the communicator (ncclCommAbort, which ends the waiting kernels and frees it, an attached one too: the
// engine must then not destroy it) and throws tfe::CudaError naming what happened; every later call is
// then refused.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>

#include <cuda_runtime.h>
#include <nccl.h>

#include <tfe/error.h>
#include <tfe/runtime.h>

namespace tfe {

struct BroadcastOptions {
  int max_streams = 0;                       // rows a broadcast carries at most: rank 0's largest streams bucket
  int max_steps = 0;                         // rank 0's plan max_steps (its outputs' row stride)
  int device = 0;                            // this rank's GPU
  std::chrono::milliseconds timeout{60000};  // wait()'s bound
};

class DraftBroadcast {
 public:
  // Joins a communicator the engine made (rank 0 of it runs the head). Not owned: the engine destroys it,
  // after this object.
  static DraftBroadcast attach(ncclComm_t comm, const BroadcastOptions& options);
  // A non-blocking communicator of its own from rank 0's unique_id(), which the engine hands every rank
  // (torch.distributed, MPI, a file). Owned: destroyed with this object.
  static DraftBroadcast create(const ncclUniqueId& id, int ranks, int rank, const BroadcastOptions& options);
  static ncclUniqueId unique_id();

  DraftBroadcast(DraftBroadcast&&) noexcept;
  DraftBroadcast& operator=(DraftBroadcast&&) noexcept;
  DraftBroadcast(const DraftBroadcast&) = delete;
  DraftBroadcast& operator=(const DraftBroadcast&) = delete;
  ~DraftBroadcast();

  int rank() const;
  int ranks() const;

  // Rank 0: broadcasts a draft's outputs (Runtime::draft_async's or device_outputs(), enqueued earlier on
  // `stream`) and returns them unchanged. Its row stride must be options.max_steps.
  DeviceDraftOutputs send(const DeviceDraftOutputs& drafted, cudaStream_t stream);
  // Every other rank: receives `rows` x `steps` (as rank 0 sent them) into its own buffers, row stride
  // max_steps, valid until the next receive.
  DeviceDraftOutputs receive(int rows, int steps, cudaStream_t stream);
  // Waits for `stream` within the timeout; throws (and aborts the communicator) at an NCCL error or past it.
  void wait(cudaStream_t stream);

 private:
  struct Impl;
  explicit DraftBroadcast(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tfe
