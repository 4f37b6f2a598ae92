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
#include "comm/node_topology.h"

namespace mfsdp {
namespace {

std::mutex g_mu;
ProcessDevice g_selected;  // device -1 until select_device_for_process succeeds

}  // namespace

ProcessDevice select_device_for_process() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_selected.device >= 0) return g_selected;
  ProcessDevice d;
  const NodeTopology topology = world_node_topology();  // the node-local rank picks the GPU
  d.local_rank = topology.local_rank;
  d.local_size = topology.local_size;
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
