// Tensor, views, storage release and the tracking allocator.
#include <catch2/catch.hpp>

#include "runtime/autograd.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

using namespace mfsdp;

TEST_CASE("views share storage at an offset", "[tensor]") {
  Tensor flat = Tensor::zeros({10});
  Tensor a = flat.view(2, {2, 3});
  a.fill(5.0f);
  auto v = flat.to_vector();
  CHECK(v[0] == 0.0f);
  CHECK(v[1] == 0.0f);
  for (int i = 2; i < 8; ++i) CHECK(v[i] == 5.0f);
  CHECK(v[8] == 0.0f);
  CHECK(a.storage() == flat.storage());
  CHECK(a.offset() == 2);
  CHECK_THROWS_WITH(flat.view(8, {3}), Catch::Contains("[view]"));
}

TEST_CASE("tracking allocator counts exact current and peak bytes per category", "[tensor][memory]") {
  auto& mt = MemoryTracker::instance();
  const int64_t base_act = mt.current(Device::CPU, MemCategory::activations);
  const int64_t base_grad = mt.current(Device::CPU, MemCategory::gradients);
  mt.reset_peaks();
  {
    MemCategoryScope s(MemCategory::activations);
    Tensor a = Tensor::empty({100});  // 400 bytes
    {
      Tensor b = Tensor::empty({50});  // 200 bytes
      CHECK(mt.current(Device::CPU, MemCategory::activations) == base_act + 600);
    }
    CHECK(mt.current(Device::CPU, MemCategory::activations) == base_act + 400);
    MemCategoryScope g(MemCategory::gradients);
    Tensor c = Tensor::empty({25});  // 100 bytes
    CHECK(mt.current(Device::CPU, MemCategory::gradients) == base_grad + 100);
  }
  CHECK(mt.current(Device::CPU, MemCategory::activations) == base_act);
  CHECK(mt.peak(Device::CPU, MemCategory::activations) == base_act + 600);
  CHECK(mt.peak(Device::CPU, MemCategory::gradients) == base_grad + 100);
}

TEST_CASE("released storage frees bytes and can be materialized again", "[tensor][memory]") {
  auto& mt = MemoryTracker::instance();
  MemCategoryScope s(MemCategory::gathered_params);
  const int64_t base = mt.current(Device::CPU, MemCategory::gathered_params);
  Tensor t = Tensor::zeros({256});
  Tensor v = t.view(128, {128});
  CHECK(mt.current(Device::CPU, MemCategory::gathered_params) == base + 1024);
  t.storage()->release();
  CHECK(mt.current(Device::CPU, MemCategory::gathered_params) == base);
  CHECK_THROWS_AS(v.data_f32(), std::logic_error);
  t.storage()->materialize();
  v.fill(2.0f);
  CHECK(t.to_vector()[200] == 2.0f);
}

TEST_CASE("bf16 conversion rounds to nearest even", "[tensor]") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(float_to_bf16(1.0f + 1.0f / 256).bits == float_to_bf16(1.0f).bits);  // tie -> even
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  Tensor x = Tensor::from_vector({1.5f, -2.25f, 3.0e-3f}, {3});
  auto back = x.to(DType::bf16).to(DType::f32).to_vector();
  CHECK(back[0] == 1.5f);
  CHECK(back[1] == -2.25f);
  CHECK(back[2] == Approx(3.0e-3f).epsilon(1e-2));
}

TEST_CASE("ops reject mismatched shapes and dtypes naming the op", "[ops]") {
  Tensor x = Tensor::zeros({4, 8}), W = Tensor::zeros({3, 7});
  CHECK_THROWS_WITH(linear(x, W), Catch::Contains("[linear]") && Catch::Contains("[3, 7]"));
  CHECK_THROWS_WITH(add(x, Tensor::zeros({4, 7})), Catch::Contains("[add]"));
  CHECK_THROWS_WITH(layer_norm(x, Tensor::zeros({7}), Tensor::zeros({8})), Catch::Contains("[layer_norm]"));
  Tensor logits = Tensor::zeros({2, 128});
  CHECK_THROWS_WITH(cross_entropy(logits, tokens_tensor({1, 70}, {2}), 65), Catch::Contains("target 70"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({2}), 65), Catch::Contains("i32"));
}

TEST_CASE("autograd accumulates into preallocated gradient views and respects no-grad", "[autograd]") {
  Tensor flat_grad = Tensor::zeros({6});
  Tensor a = Tensor::from_vector({1, 2, 3}, {3}).set_requires_grad();
  Tensor b = Tensor::from_vector({4, 5, 6}, {3}).set_requires_grad();
  a.set_grad(flat_grad.view(0, {3}));
  b.set_grad(flat_grad.view(3, {3}));
  Tensor y = add(add(a, b), a);  // dy/da = 2, dy/db = 1
  backward(y, Tensor::from_vector({1, 1, 1}, {3}));
  backward(add(a, b), Tensor::from_vector({1, 1, 1}, {3}));  // accumulates
  auto g = flat_grad.to_vector();
  CHECK(g == std::vector<float>{3, 3, 3, 2, 2, 2});
  {
    NoGradGuard ng;
    Tensor z = add(a, b);
    CHECK_FALSE(z.requires_grad());
  }
}
