// Every rank resolves `auto` alike: the probe's rates are summed over the ranks before the
// decision, so ranks whose own measurements disagree still pick the same dtype. Run at 2 ranks.
#include <catch2/catch.hpp>
#include <mpi.h>

#include "apps/train/run_precision.h"
#include "comm/mpi_backends.h"
#include "optim/ns_probe.h"
#include "runtime/gemm_probe.h"

using namespace mfsdp;

TEST_CASE("ranks with different probe rates agree on auto and on the MFU denominator", "[precision][mpi]") {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const int rank = comm->rank(), world = comm->world_size();
  // rank 0 alone would pick f32, every other rank alone bf16
  const GemmRates mine = rank == 0 ? GemmRates{400, 100} : GemmRates{100, 200 + 10.0 * rank};
  const GemmRates sum = sum_over_ranks(mine, *comm);
  TrainConfig c;
  c.precision.matmul = c.precision.ns = DTypeChoice::auto_;
  const RunPrecision p = decide_precision(c, Device::CPU, world, true, sum, sum);
  const double mine_view[3] = {p.matmul == DType::bf16 ? 1.0 : 0.0, p.ns == NsDType::bf16 ? 1.0 : 0.0,
                               p.peak_tflops_total};
  double lo[3], hi[3];
  MPI_Allreduce(mine_view, lo, 3, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine_view, hi, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < 3; ++i) CHECK(lo[i] == hi[i]);
  if (world == 2) {
    CHECK(p.matmul == DType::f32);  // 500 f32 against 310 bf16 over both ranks
    CHECK(p.peak_tflops_total == Approx(0.5));
  }
}

TEST_CASE("resolve_precision on CPU ranks writes the same choice into every rank's options", "[precision][mpi]") {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  TrainConfig c;
  c.model.n_embd = 64, c.model.seq_len = 32, c.training.micro_batch_size = 2;
  c.precision.matmul = c.precision.ns = DTypeChoice::auto_;
  const RunPrecision p = resolve_precision(c, *comm, nullptr);
  CHECK(p.probed);
  // The expectation, formed without the trainer's code: this rank's probes (cached per process,
  // so the rates resolve_precision measured) summed with MPI here, and the documented rule
  // written out: bf16 when the summed bf16 rate is at least 1.15x (GEMM) / 1x (Newton-Schulz step)
  // the f32 rate.
  const GemmRates mm = probe_cpu_gemm_rates(matmul_probe_shape(c));
  const GemmShape ns_shape = ns_probe_shape(c);
  const GemmRates ns = probe_orthogonalizer_rates(ns_shape.M, ns_shape.K, c.optim.muon.orthogonalizer);
  const double local[4] = {mm.f32, mm.bf16, ns.f32, ns.bf16};
  double summed[4];
  MPI_Allreduce(local, summed, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  CHECK(p.matmul_rates.f32 == summed[0]);
  CHECK(p.matmul_rates.bf16 == summed[1]);
  CHECK(p.ns_rates.f32 == summed[2]);
  CHECK(p.ns_rates.bf16 == summed[3]);
  CHECK(summed[0] > 0);
  CHECK((c.optim.matmuls() == DType::bf16) == (summed[1] >= 1.15 * summed[0]));
  CHECK((c.optim.muon.ns_dtype == NsDType::bf16) == (summed[3] >= 1.0 * summed[2]));
  const double mine[2] = {c.optim.matmuls() == DType::bf16 ? 1.0 : 0.0, c.optim.muon.ns_dtype == NsDType::bf16 ? 1.0 : 0.0};
  double lo[2], hi[2];
  MPI_Allreduce(mine, lo, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo[0] == hi[0]);
  CHECK(lo[1] == hi[1]);
}
