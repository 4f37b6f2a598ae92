#include "runtime/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "runtime/autograd.h"
#include "runtime/block_cache.h"
#include "runtime/cuda/device_api.h"
#include "runtime/kernels.h"

namespace mfsdp {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw std::invalid_argument("[shape] negative dimension in " + shape_str(s));
    n *= d;
  }
  return n;
}

// ---------------- Storage ----------------


Storage::Storage(int64_t bytes, Device device, MemCategory category)
    : nbytes_(bytes), device_(device), category_(category) {
  if (bytes < 0) throw std::invalid_argument("[Storage] negative size " + std::to_string(bytes));
  materialize();
}

Storage::~Storage() { release(); }

void* Storage::data() const {
  if (!materialized()) throw std::logic_error("[Storage] access to released storage (" + std::to_string(nbytes_) + " bytes, " + mem_category_name(category_) + ")");
  return ptr_;
}

void Storage::materialize() {
  if (ptr_ || nbytes_ == 0) return;
  ptr_ = block_cache(device_).get(static_cast<size_t>(nbytes_));
  MemoryTracker::instance().on_alloc(device_, category_, nbytes_);
}

void Storage::release() {
  if (!ptr_) return;
  block_cache(device_).put(ptr_, static_cast<size_t>(nbytes_));
  ptr_ = nullptr;
  MemoryTracker::instance().on_free(device_, category_, nbytes_);
}

// ---------------- Tensor ----------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device, current_mem_category());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemCategory category) {
  const int64_t n = shape_numel(shape);
  auto st = std::make_shared<Storage>(n * dtype_size(dtype), device, category);
  return view_of(std::move(st), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  check_arg(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector",
            std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Tensor host = empty(shape, DType::f32, Device::CPU);
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(float));
  return device == Device::CPU ? host : host.to(device);
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape, DType dtype) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  check_arg(offset >= 0 && (offset + t.numel_) * dtype_size(dtype) <= storage->nbytes(), "view",
            "shape " + shape_str(shape) + " at offset " + std::to_string(offset) + " exceeds storage of " +
                std::to_string(storage->nbytes()) + " bytes");
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.meta_ = std::make_shared<AutogradMeta>();
  return t;
}

int64_t Tensor::size(int64_t i) const {
  const int64_t d = dim();
  if (i < 0) i += d;
  check_arg(i >= 0 && i < d, "size", "dimension " + std::to_string(i) + " of " + describe());
  return shape_[i];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::CPU; }

void* Tensor::data_ptr() const {
  if (!storage_) throw std::logic_error("[Tensor] data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

float* Tensor::data_f32() const {
  check_arg(dtype_ == DType::f32, "data_f32", "tensor is " + describe());
  return static_cast<float*>(data_ptr());
}

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  check_arg(defined(), "view", "undefined tensor");
  check_arg(offset >= 0 && offset + shape_numel(shape) <= numel_, "view",
            "shape " + shape_str(shape) + " at offset " + std::to_string(offset) + " exceeds " + describe());
  return view_of(storage_, offset_ + offset, shape, dtype_);
}

Tensor Tensor::detach() const { return view(0, shape_); }

Tensor Tensor::reshape(const Shape& shape) const {
  check_arg(shape_numel(shape) == numel_, "reshape", describe() + " to " + shape_str(shape));
  Tensor out = view(0, shape);
  if (needs_grad({this})) {
    Tensor self = *this;
    record(out, "reshape", {self}, [self](const Tensor& g) { accumulate_grad(self, g.view(0, self.shape())); });
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device d) const {
  Tensor out = empty(shape_, dtype_, d);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype_) return clone();
  Tensor out = empty(shape_, dt, device());
  kernels(device()).convert(data_ptr(), dtype_, out.data_ptr(), dt, numel_);
  return out;
}

namespace {
std::atomic<int64_t> g_host_device_bytes{0};
}  // namespace

int64_t host_device_copy_bytes() { return g_host_device_bytes.load(std::memory_order_relaxed); }

void Tensor::copy_from(const Tensor& src) const {
  check_arg(src.numel() == numel_ && src.dtype() == dtype_, "copy_from", describe() + " <- " + src.describe());
  const int64_t bytes = nbytes();
  if (bytes == 0) return;
  const Device a = device(), b = src.device();
  if (a != b) g_host_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (a == Device::CPU && b == Device::CPU) std::memcpy(data_ptr(), src.data_ptr(), bytes);
  else if (a == Device::CUDA && b == Device::CPU) cuda::copy_h2d(data_ptr(), src.data_ptr(), bytes);
  else if (a == Device::CPU && b == Device::CUDA) cuda::copy_d2h(data_ptr(), src.data_ptr(), bytes);
  else cuda::copy_d2d(data_ptr(), src.data_ptr(), bytes);
}

void Tensor::copy_from_host(const void* src) const {
  const int64_t bytes = nbytes();
  if (bytes == 0) return;
  check_arg(src != nullptr, "copy_from_host", "null source for " + describe());
  if (device() == Device::CPU) {
    std::memcpy(data_ptr(), src, bytes);
  } else {
    g_host_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
    cuda::copy_h2d(data_ptr(), src, bytes);
  }
}

void Tensor::copy_to_host(void* dst) const {
  const int64_t bytes = nbytes();
  if (bytes == 0) return;
  check_arg(dst != nullptr, "copy_to_host", "null destination for " + describe());
  if (device() == Device::CPU) {
    std::memcpy(dst, data_ptr(), bytes);
  } else {
    g_host_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
    cuda::copy_d2h(dst, data_ptr(), bytes);
  }
}

void Tensor::fill(float value) const {
  if (numel_ == 0) return;
  check_arg(dtype_ == DType::f32, "fill", "only f32 tensors, got " + describe());
  kernels(device()).fill(data_f32(), value, numel_);
}

void Tensor::zero() const {
  if (numel_ == 0) return;
  if (device() == Device::CPU) std::memset(data_ptr(), 0, nbytes());
  else cuda::memset_device(data_ptr(), 0, nbytes());
}

std::vector<float> Tensor::to_vector() const {
  Tensor host = device() == Device::CPU ? *this : to(Device::CPU);
  if (dtype_ == DType::bf16) host = host.to(DType::f32);
  const float* p = numel_ ? host.data_f32() : nullptr;
  return std::vector<float>(p, p + numel_);
}

float Tensor::item() const {
  check_arg(numel_ == 1, "item", "tensor has " + std::to_string(numel_) + " elements");
  return to_vector()[0];
}

bool Tensor::requires_grad() const { return meta_ && (meta_->requires_grad || meta_->grad_fn); }

Tensor& Tensor::set_requires_grad(bool r) {
  check_arg(defined(), "set_requires_grad", "undefined tensor");
  meta_->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const { return meta_ ? meta_->grad : Tensor(); }

void Tensor::set_grad(const Tensor& g) const {
  check_arg(defined(), "set_grad", "undefined tensor");
  if (g.defined())
    check_arg(g.shape() == shape_ && g.dtype() == DType::f32, "set_grad",
              "grad " + g.describe() + " for " + describe() + " (gradients are f32 of the tensor's shape)");
  meta_->grad = g;
}

void Tensor::clear_grad() const {
  if (meta_) meta_->grad = Tensor();
}

std::shared_ptr<Node> Tensor::grad_fn() const { return meta_ ? meta_->grad_fn : nullptr; }
void Tensor::set_grad_fn(std::shared_ptr<Node> fn) { meta_->grad_fn = std::move(fn); }

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + "@" + device_name(device());
}

}  // namespace mfsdp
