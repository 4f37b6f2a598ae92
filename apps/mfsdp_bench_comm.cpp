// mfsdp-bench-comm: collective benchmark in the style of nccl-tests. Sweeps buffer sizes, checks
// results on deterministic per-rank data, and prints time, algorithm and bus bandwidth for
// all_gather(_v), reduce_scatter(_v) and all_reduce, with a matrixfsdp-like uneven layout for the
// _v collectives. Run: mpirun -np 4 --oversubscribe bin/mfsdp-bench-comm --max-bytes 16M
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "apps/cli_common.h"
#include "comm/comm_factory.h"
#include "runtime/core/clock.h"
#include "runtime/cuda/device_api.h"
#include "runtime/tensor.h"

using namespace mfsdp;

namespace {

/// Buffer in host memory or in a CUDA Tensor, with a host copy for initialisation and checking.
struct Buffer {
  Device dev;
  std::vector<unsigned char> host;
  Tensor device_bytes;  // CUDA only: bf16 elements (every size here is whole f32 or bf16 values)
  Buffer(Device d, int64_t bytes) : dev(d), host(static_cast<size_t>(bytes)) {
    if (dev == Device::CUDA) device_bytes = Tensor::empty({bytes / 2}, DType::bf16, Device::CUDA);
  }
  void* ptr() { return dev == Device::CPU ? (host.empty() ? nullptr : host.data()) : device_bytes.data_ptr(); }
  void upload() {
    if (dev == Device::CUDA) device_bytes.copy_from_host(host.data());
  }
  void download() {
    if (dev == Device::CUDA) device_bytes.copy_to_host(host.data());
  }
};

void sync_device(Device d) {
  if (d == Device::CUDA) cuda::synchronize();
}

// Per-rank data: small integers, exact in f32 and bf16 and in their sums (closed-form checks).
float val(int rank, int64_t i) { return float(rank + 1) + float(i % 5); }
void put(std::vector<unsigned char>& h, DType dt, int64_t i, float v) {
  if (dt == DType::f32) std::memcpy(&h[i * 4], &v, 4);
  else { bf16 b = float_to_bf16(v); std::memcpy(&h[i * 2], &b, 2); }
}
float get(const std::vector<unsigned char>& h, DType dt, int64_t i) {
  if (dt == DType::f32) { float v; std::memcpy(&v, &h[i * 4], 4); return v; }
  bf16 b; std::memcpy(&b, &h[i * 2], 2); return bf16_to_float(b);
}

/// matrixfsdp-like owner layout of one transformer block: whole matrices (fc, fc_proj, qkv, proj
/// in weight 4:4:3:1) go to the least-loaded rank (LPT, lowest rank on ties), then a small tail
/// of non-matrix tensors (1% of the unit) goes to the least-loaded rank; other ranks stay empty.
std::vector<int64_t> matrixfsdp_layout(int64_t total, int n) {
  const double w[] = {4, 4, 3, 1, 0.12};
  const double wsum = 12.12;
  std::vector<int64_t> counts(n, 0);
  int64_t used = 0;
  for (int k = 0; k < 5; ++k) {
    const int64_t c = k == 4 ? total - used : static_cast<int64_t>(total * (w[k] / wsum));
    const int r = static_cast<int>(std::min_element(counts.begin(), counts.end()) - counts.begin());
    counts[r] += c;
    used += c;
  }
  return counts;
}

struct Result {
  double us = 0;
  int64_t wrong = 0;
};

/// One row of the sweep: what to run and how.
struct Sweep {
  DType dt = DType::f32;
  int iters = 20, warmup = 5;
  bool check = true;
};

/// Runs collective `c` (0 all_gather, 1 all_gather_v, 2 reduce_scatter, 3 reduce_scatter_v,
/// 4 all_reduce) on `total` elements over `comm`: warm-up, timed iterations, then (with
/// s.check) one checked call. Returns the time per call in microseconds (max over ranks) and the
/// wrong elements (summed over ranks); the bookkeeping goes over `host`, so `comm`'s counters
/// hold only the measured collectives.
Result measure(Communicator& comm, Communicator& host, const Sweep& s, int c, int64_t total) {
  const int n = comm.world_size(), me = comm.rank();
  const Device dev = comm.device();
  const DType dt = s.dt;
  const int64_t e = dtype_size(dt);
  std::vector<int64_t> counts = c == 1 || c == 3 ? matrixfsdp_layout(total, n) : std::vector<int64_t>(n, total / n);
  const auto off = [&] { std::vector<int64_t> o(n, 0); for (int r = 1; r < n; ++r) o[r] = o[r - 1] + counts[r - 1]; return o; }();
  const bool gather = c < 2, reduce = c == 2 || c == 3;
  Buffer in(dev, (gather ? counts[me] : total) * e), out(dev, (gather ? total : reduce ? counts[me] : 0) * e);
  auto init = [&] {
    const int64_t n_in = static_cast<int64_t>(in.host.size()) / e;
    for (int64_t i = 0; i < n_in; ++i) put(in.host, dt, i, val(me, gather ? off[me] + i : i));
    in.upload();
  };
  auto run = [&] {
    switch (c) {
      case 0: comm.all_gather(in.ptr(), out.ptr(), counts[0], dt, CommPhase::other); break;
      case 1: comm.all_gather_v(in.ptr(), out.ptr(), counts, dt, CommPhase::other); break;
      case 2: comm.reduce_scatter(in.ptr(), out.ptr(), counts[0], dt, ReduceOp::sum, CommPhase::other); break;
      case 3: comm.reduce_scatter_v(in.ptr(), out.ptr(), counts, dt, ReduceOp::sum, CommPhase::other); break;
      default: comm.all_reduce(in.ptr(), total, dt, ReduceOp::sum, CommPhase::other); break;
    }
  };
  init();
  for (int i = 0; i < s.warmup; ++i) run();
  sync_device(dev);
  comm.barrier();
  const double t0 = now_seconds();
  for (int i = 0; i < s.iters; ++i) run();
  sync_device(dev);
  Result r;
  r.us = host.all_reduce_scalar((now_seconds() - t0) / s.iters * 1e6, ReduceOp::max, CommPhase::other);
  int64_t wrong = 0;
  if (s.check) {
    init();
    run();
    auto sum_of = [&](int64_t i) { return float(n * (n + 1) / 2) + float(n) * float(i % 5); };
    if (gather) {
      out.download();
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < counts[q]; ++i) wrong += get(out.host, dt, off[q] + i) != val(q, off[q] + i);
    } else if (reduce) {
      out.download();
      for (int64_t i = 0; i < counts[me]; ++i) wrong += get(out.host, dt, i) != sum_of(off[me] + i);
    } else {
      in.download();
      for (int64_t i = 0; i < total; ++i) wrong += get(in.host, dt, i) != sum_of(i);
    }
  }
  // Counts of elements: exact in the f64 sum.
  r.wrong = static_cast<int64_t>(host.all_reduce_scalar(static_cast<double>(wrong), ReduceOp::sum, CommPhase::other));
  return r;
}

/// The table over full-buffer sizes min_bytes, min_bytes * factor, ... <= max_bytes, every
/// collective at each; rank 0 prints it. Returns the wrong elements of all rows.
int64_t sweep(Communicator& comm, Communicator& host, const Sweep& s, int64_t min_bytes, int64_t max_bytes,
              int factor) {
  const int n = comm.world_size();
  const int64_t e = dtype_size(s.dt);
  if (comm.rank() == 0) {
    std::printf("# mfsdp-bench-comm: backend %s, %d ranks, dtype %s, iters %d, warmup %d, check %s\n",
                comm.backend_name(), n, dtype_name(s.dt), s.iters, s.warmup, s.check ? "on" : "off");
    std::printf("# size = full buffer bytes (gather output / reduce input); time = max over ranks\n");
    std::printf("# busbw = algbw * (n-1)/n (gathers, reduce-scatters), 2(n-1)/n (all_reduce)\n");
    std::printf("#%13s %12s  %-18s %11s %12s %12s %7s\n", "size(B)", "elements", "collective",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  const char* names[] = {"all_gather", "all_gather_v", "reduce_scatter", "reduce_scatter_v", "all_reduce"};
  int64_t total_wrong = 0;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const int64_t total = std::max<int64_t>(n, bytes / e / n * n);  // divisible by n
    for (int c = 0; c < 5; ++c) {
      const Result r = measure(comm, host, s, c, total);
      total_wrong += r.wrong;
      const double algbw = double(total * e) / (r.us * 1e-6) / 1e9;
      const double bus = algbw * (c == 4 ? 2.0 * (n - 1) / n : double(n - 1) / n);
      if (comm.rank() == 0)
        std::printf(" %13lld %12lld  %-18s %11.1f %12.3f %12.3f %7lld\n", (long long)(total * e),
                    (long long)total, names[c], r.us, algbw, bus, (long long)r.wrong);
    }
  }
  return total_wrong;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  CLI::App app{"MatrixFSDP collective benchmark (nccl-tests style)"};
  std::string backend = "mpi", dtype_s = "f32";
  int64_t min_bytes = 4 << 10, max_bytes = 4 << 20, chunk_bytes = 4 << 20;
  int factor = 4, iters = 20, warmup = 5;
  bool check = true, nccl_blocking = false;
  app.add_option("--backend", backend, "mpi, cuda_staged or nccl")
      ->check(CLI::IsMember({"mpi", "cuda_staged", "nccl"}));
  app.add_option("--dtype", dtype_s, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  const int64_t most_bytes = int64_t{1} << 36;  // 64 GiB: beyond any device, and no overflow in the size loop
  app.add_option("--min-bytes", min_bytes, "smallest full-buffer size in bytes, K/M/G suffixes ok (default 4K)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, most_bytes));
  app.add_option("--max-bytes", max_bytes, "largest full-buffer size in bytes (default 4M; try 64M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, most_bytes));
  app.add_option("--factor", factor, "size multiplier between rows")->check(CLI::Range(2, 1024));
  app.add_option("--iters", iters, "timed iterations per size")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed iterations per size")->check(CLI::Range(0, 1000000));
  app.add_option("--chunk-bytes", chunk_bytes, "reduce_scatter staging chunk per rank (default 4M)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(int64_t{1}, most_bytes));
  app.add_option("--check", check, "verify results (default true)");
  app.add_flag("--nccl-blocking", nccl_blocking, "NCCL: a blocking communicator whose calls wait (diagnostics)");
  if (const int rc = cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;
  Sweep s;
  s.dt = parse_dtype(dtype_s);
  s.iters = iters;
  s.warmup = warmup;
  s.check = check;
  CommOptions opts;
  opts.reduce_chunk_bytes = chunk_bytes;
  CudaCommOptions cuda_opts;
  cuda_opts.blocking = nccl_blocking;
  std::unique_ptr<Communicator> comm, host;
  try {  // the CUDA backends select this process's device first
    host = make_host_communicator();
    comm = make_communicator(parse_comm_backend(backend), opts, cuda_opts);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s\n", ex.what());
    return 1;
  }
  const int64_t total_wrong = sweep(*comm, *host, s, min_bytes, max_bytes, factor);
  if (comm->rank() == 0) {
    const auto t = comm->counters().total();
    std::printf("# %s; counters this rank: %lld calls, %lld bytes sent, %lld received\n",
                total_wrong ? "RESULT CHECK FAILED" : "all results correct", (long long)t.calls,
                (long long)t.bytes_sent, (long long)t.bytes_received);
  }
  return total_wrong ? 2 : 0;
}
