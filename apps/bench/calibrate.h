// Calibration of the projection's constants on this machine (mfsdp-project --calibrate).
#pragma once
#include "comm/communicator.h"
#include "planner/projection.h"

namespace mfsdp {

/// Measures this machine and returns it as a ClusterSpec named "this_machine": on rank 0 alone
/// with one thread (the others wait), the f32 and bf16 GEMM rates (768 x 3072 x 768, best of 3;
/// gemm_tflops_f32 / gemm_tflops_bf16, no curve: the rate is flat on CPU), the
/// Newton-Schulz rate of a [768, 3072] Muon orthogonalization (ns_efficiency = NS rate / GEMM
/// rate), a one-layer GPT-2-width forward + backward at T = 64 (model_efficiency) and AdamW over
/// 4M elements (mem_GBps); on every rank, the all_gather_v bandwidth of 8 MB per rank and the
/// latency of all_reduce_scalar (intra_*; inter_* = intra_*). cores_per_node is the hardware
/// concurrency, gpus_per_node 1024 (one node), linear_latency true (direct MPI messages).
/// Collective over `comm`; every rank returns the same values.
ClusterSpec calibrate_this_machine(Communicator& comm);

}  // namespace mfsdp
