// Tensor: a shape and dtype over a reference-counted Storage, plus optional autograd metadata.
//
// Every tensor is contiguous row-major; a view is a contiguous run of its storage at an element
// offset, so one flat FSDP-unit buffer can back many parameter tensors without copies. Storage can
// be released (bytes freed, object kept) and re-materialized: the engine frees a unit's gathered
// parameters after forward and gathers them into the same Storage again for backward, while the
// autograd graph keeps referring to the same tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/memory.h"

namespace mfsdp {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

/// Raw bytes on one device, charged to one memory category. Not copyable.
class Storage {
 public:
  /// Allocates `bytes` (64-byte aligned on CPU). Contents are uninitialised.
  Storage(int64_t bytes, Device device, MemCategory category);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// Pointer to the bytes; throws std::logic_error when the storage is released.
  void* data() const;
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return category_; }
  bool materialized() const { return ptr_ != nullptr || nbytes_ == 0; }
  /// Frees the bytes but keeps the object (and every tensor referring to it) alive.
  void release();
  /// Allocates the bytes again after release() (contents uninitialised). No-op when materialized.
  void materialize();

 private:
  void* ptr_ = nullptr;
  int64_t nbytes_ = 0;
  Device device_;
  MemCategory category_;
};

class Node;
struct AutogradMeta;

/// A tensor handle (cheap to copy; copies share storage and autograd metadata).
class Tensor {
 public:
  Tensor() = default;

  // ---- factories (charged to current_mem_category() unless given) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::CPU);
  static Tensor empty(const Shape& shape, DType dtype, Device device, MemCategory category);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::CPU);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            Device device = Device::CPU);
  /// A tensor over existing storage at `offset` elements (no copy). Throws when out of range.
  static Tensor view_of(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension i (negative i counts from the end).
  int64_t size(int64_t i) const;
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  /// Typed pointer to the first element. f32 tensors only for data_f32 (throws otherwise).
  float* data_f32() const;
  void* data_ptr() const;
  template <class T>
  T* data() const { return static_cast<T*>(data_ptr()); }

  /// A view of `shape` starting `offset` elements into this tensor (shares storage, no autograd).
  Tensor view(int64_t offset, const Shape& shape) const;
  /// Same data, new shape with equal numel. Keeps autograd history through a reshape node when
  /// gradients are being recorded.
  Tensor reshape(const Shape& shape) const;
  /// Same storage, no autograd history (a new leaf).
  Tensor detach() const;

  /// Deep copies.
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  /// Copies `src` (same numel and dtype, any device) into this tensor's bytes.
  void copy_from(const Tensor& src) const;
  /// Copies nbytes() bytes from host memory into this tensor / from it to host memory (any device).
  void copy_from_host(const void* src) const;
  void copy_to_host(void* dst) const;
  void fill(float value) const;
  void zero() const;
  std::vector<float> to_vector() const;
  /// Value of a single-element f32 tensor (copied to host).
  float item() const;

  // ---- autograd ----
  bool requires_grad() const;
  /// Marks a leaf as trainable; its gradient accumulates into grad().
  Tensor& set_requires_grad(bool r = true);
  /// The accumulated gradient (undefined until backward writes one or set_grad is called).
  Tensor grad() const;
  /// Preallocated gradient buffer (e.g. a view into a unit's flat gradient buffer); backward adds
  /// into it. Gradients are f32 of the tensor's shape (a bf16 activation's too); throws
  /// std::invalid_argument otherwise.
  void set_grad(const Tensor& g) const;
  void clear_grad() const;
  std::shared_ptr<Node> grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> fn);
  AutogradMeta* autograd_meta() const { return meta_.get(); }
  /// Identity of the autograd record (same for copies of this handle).
  const void* id() const { return meta_.get(); }

  std::string describe() const;  // "f32[2, 3]@cpu"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  std::shared_ptr<AutogradMeta> meta_;
};

/// Per-tensor autograd record, shared by copies of a handle.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
};

/// Bytes moved between host and device by Tensor copies (copy_from across devices, to(Device),
/// copy_from_host / copy_to_host of device tensors) since the process started; thread-safe.
/// Telemetry: a step on a GPU that suddenly moves weight-sized bytes fell back to the host.
int64_t host_device_copy_bytes();

}  // namespace mfsdp
