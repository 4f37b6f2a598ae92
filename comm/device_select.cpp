// The process's CUDA device: chosen once, from the world's node-local rank, before any CUDA
// communicator is made, so every communicator of the process (shard, replica, world) agrees on it.
// Built with CUDA only; cuda_comm_stub.cpp stands in for it otherwise.
#include <cuda_runtime.h>
#include <mpi.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "comm/comm_detail.h"
#include "comm/comm_factory.h"

namespace mfsdp {
namespace {

std::mutex g_mu;
ProcessDevice g_selected;  // device -1 until select_device_for_process succeeds

// This process's rank among the world's processes on its node, and how many there are.
void node_local_rank(int& local_rank, int& local_size) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) throw std::runtime_error("[select_device_for_process] MPI is not initialised");
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw std::runtime_error("[select_device_for_process] MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
}

}  // namespace

ProcessDevice select_device_for_process() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_selected.device >= 0) return g_selected;
  ProcessDevice d;
  node_local_rank(d.local_rank, d.local_size);
  if (cudaGetDeviceCount(&d.device_count) != cudaSuccess) d.device_count = 0;
  if (d.device_count == 0)
    throw std::runtime_error("[select_device_for_process] no CUDA device is visible (local rank " +
                             std::to_string(d.local_rank) + ")");
  d.device = d.local_rank % d.device_count;
  const cudaError_t e = cudaSetDevice(d.device);
  if (e != cudaSuccess)
    throw std::runtime_error("[select_device_for_process] cudaSetDevice(" + std::to_string(d.device) +
                             ") failed: " + cudaGetErrorString(e));
  g_selected = d;
  return d;
}

void bind_thread_to_process_device() {
  const ProcessDevice d = selected_process_device();
  if (d.device < 0)
    throw std::runtime_error("[bind_thread_to_process_device] no device was selected for this process");
  const cudaError_t e = cudaSetDevice(d.device);
  if (e != cudaSuccess)
    throw std::runtime_error("[bind_thread_to_process_device] cudaSetDevice(" + std::to_string(d.device) +
                             ") failed: " + cudaGetErrorString(e));
}

namespace detail {
ProcessDevice check_process_device(const char* who) {
  const ProcessDevice d = selected_process_device();
  if (d.device < 0)
    throw std::runtime_error(std::string("[") + who +
                             "] no CUDA device was selected for this process: call select_device_for_process() "
                             "(comm/comm_factory.h) on every rank before making a CUDA communicator");
  int current = -1;
  const cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("[") + who + "] cudaGetDevice failed: " + cudaGetErrorString(e));
  if (current != d.device)
    throw std::runtime_error(std::string("[") + who + "] the current CUDA device is " + std::to_string(current) +
                             " but this process selected device " + std::to_string(d.device) +
                             " (local rank " + std::to_string(d.local_rank) +
                             "); something changed the device after select_device_for_process()");
  return d;
}
}  // namespace detail

ProcessDevice selected_process_device() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_selected;
}

}  // namespace mfsdp
