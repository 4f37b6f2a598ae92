// The owner's rank-ordered reduction kernel of the NCCL backend (comm/nccl_kernels.cu) in one
// process: several sources (the staged contributions and the owner's own slice), every reduce op,
// f32 and bf16, against a host closed form that adds the sources in the same order 0..N-1 in f32
// (so the results must be equal bit for bit). Values mix magnitudes 1e-3 .. 1e7 and signs, so
// any other order or accumulation width changes the bits. Exits 77 (skipped) without a device.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "comm/nccl_kernels.h"
#include "runtime/tensor.h"

using namespace mfsdp;

namespace {

// Contributions as f32 values; for bf16 they are first rounded to bf16 (what the wire carries).
std::vector<float> values(int64_t n, uint32_t seed, DType dt) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-3, 7);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = mant(rng) * std::pow(10.0f, static_cast<float>(expo(rng)));
    if (x == 0.0f) x = 1.0f;
    if (dt == DType::bf16) x = bf16_to_float(float_to_bf16(x));
  }
  return v;
}

std::vector<unsigned char> encode(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::f32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const bf16 b = float_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

// The closed form: out[i] = op over j = 0..nsrc-1 of src_j[i], accumulated in f32 in that order
// (accumulate starts from out's f32 value, sum and mean from +0), bf16 outputs rounded once.
std::vector<unsigned char> host_reduce(const std::vector<std::vector<float>>& src, const std::vector<float>& start,
                                       DType dt, ReduceOp op) {
  const size_t n = src[0].size(), nsrc = src.size();
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) {
    float acc;
    if (op == ReduceOp::max) {
      acc = src[0][i];
      for (size_t j = 1; j < nsrc; ++j) acc = std::fmax(acc, src[j][i]);
    } else {
      acc = op == ReduceOp::accumulate ? start[i] : 0.0f;
      for (size_t j = 0; j < nsrc; ++j) acc = acc + src[j][i];
      if (op == ReduceOp::mean) acc = acc / static_cast<float>(nsrc);
    }
    r[i] = acc;
  }
  return encode(r, op == ReduceOp::accumulate ? DType::f32 : dt);
}

}  // namespace

TEST_CASE("ordered_reduce kernel: sources added in rank order, bitwise equal to the host", "[comm][cuda][kernel]") {
  const int64_t n = 100003;         // not a multiple of the block size
  const int64_t stride = n + 29;    // staging slots further apart than the slice
  for (DType dt : {DType::f32, DType::bf16})
    for (int nsrc : {1, 2, 3, 5, 8})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::accumulate}) {
        const int own = (nsrc * 7 + 3) % nsrc;  // the owner's own slice at varying positions
        INFO(dtype_name(dt) << ", " << nsrc << " sources, own index " << own << ", " << reduce_op_name(op));
        const int64_t e = dtype_size(dt);
        std::vector<std::vector<float>> src;
        for (int j = 0; j < nsrc; ++j) src.push_back(values(n, 1000u + 31u * j + nsrc, dt));
        const std::vector<float> start = values(n, 77u, DType::f32);
        // staging: every source in its slot except the owner's, which is passed separately
        std::vector<unsigned char> stage(static_cast<size_t>(nsrc * stride * e), 0xAB);
        for (int j = 0; j < nsrc; ++j)
          if (j != own) {
            const auto b = encode(src[j], dt);
            std::memcpy(&stage[static_cast<size_t>(j * stride * e)], b.data(), b.size());
          }
        const auto own_bytes = encode(src[own], dt);
        const int64_t out_e = op == ReduceOp::accumulate ? 4 : e;
        const Tensor dstage = Tensor::empty({nsrc * stride}, dt, Device::CUDA);
        const Tensor downed = Tensor::empty({n}, dt, Device::CUDA);
        const Tensor dout = Tensor::empty({n}, op == ReduceOp::accumulate ? DType::f32 : dt, Device::CUDA);
        dstage.copy_from_host(stage.data());
        downed.copy_from_host(own_bytes.data());
        const auto start_bytes = encode(start, DType::f32);
        if (op == ReduceOp::accumulate) dout.copy_from_host(start_bytes.data());
        detail::launch_ordered_reduce(dstage.data_ptr(), stride, downed.data_ptr(), own, nsrc, dout.data_ptr(), n, dt,
                                      op, nullptr);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        std::vector<unsigned char> got(static_cast<size_t>(n * out_e));
        REQUIRE(dout.nbytes() == static_cast<int64_t>(got.size()));
        dout.copy_to_host(got.data());
        const auto want = host_reduce(src, start, dt, op);
        REQUIRE(got.size() == want.size());
        size_t first_diff = got.size();
        for (size_t i = 0; i < got.size() && first_diff == got.size(); ++i)
          if (got[i] != want[i]) first_diff = i;
        INFO("first differing byte " << first_diff << " (element " << first_diff / out_e << ")");
        CHECK(first_diff == got.size());
        if (op == ReduceOp::sum && dt == DType::f32) {  // out may alias the owner's slice
          detail::launch_ordered_reduce(dstage.data_ptr(), stride, downed.data_ptr(), own, nsrc, downed.data_ptr(), n,
                                        dt, op, nullptr);
          downed.copy_to_host(got.data());
          CHECK(got == want);
        }
      }
}

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipping the ordered_reduce kernel test\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
