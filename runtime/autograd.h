// Reverse-mode autograd (tape-free graph of Nodes, flashlight/PyTorch style).
//
// An op that records history gives its output a Node holding the op's inputs and a backward
// function. backward(root, grad) topologically sorts the graph reachable from `root` once and runs
// the nodes in reverse order; each node adds its input gradients into the inputs' grad buffers
// (accumulate_grad). Leaves with requires_grad keep their gradients (preallocated views are added
// into in place); intermediate gradients are dropped as soon as their node has run. Gradients are
// f32 whatever the tensor's dtype (a bf16 activation gets an f32 gradient).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace mfsdp {

/// One recorded operation. `backward_fn(grad_output)` must call accumulate_grad on inputs.
class Node {
 public:
  Node(std::string name, std::vector<Tensor> inputs, std::function<void(const Tensor&)> backward_fn)
      : name_(std::move(name)), inputs_(std::move(inputs)), backward_fn_(std::move(backward_fn)) {}
  const std::string& name() const { return name_; }
  const std::vector<Tensor>& inputs() const { return inputs_; }
  void run_backward(const Tensor& grad_output) { backward_fn_(grad_output); }
  /// Drops saved tensors and edges (called after the node has run).
  void release() {
    inputs_.clear();
    backward_fn_ = nullptr;
  }

 private:
  std::string name_;
  std::vector<Tensor> inputs_;
  std::function<void(const Tensor&)> backward_fn_;
};

/// True unless a NoGradGuard is active on this thread.
bool grad_mode_enabled();

/// RAII: ops inside the scope record no history.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// True when an op whose inputs are `inputs` must record a Node.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

/// Gives `out` a Node named `name` over `inputs` when any input requires grad (and grad mode is on).
void record(Tensor& out, const char* name, std::vector<Tensor> inputs,
            std::function<void(const Tensor&)> backward_fn);

/// Returns the gradient buffer of `t`, allocating zeros of t's shape on first use, so that a
/// kernel can add into it (beta = 1). Only call for tensors with requires_grad.
Tensor grad_buffer(const Tensor& t);

/// Where an op that writes C = result + beta C (a GEMM) puts t's gradient: t's existing buffer
/// with beta 1, or on first use a new uninitialized buffer of t's shape, set as t's gradient, with
/// beta 0, so a first write needs no zero fill. Only call for tensors with requires_grad.
struct GradTarget {
  Tensor buffer;
  float beta;
};
GradTarget grad_target(const Tensor& t);

/// Adds `g` into t's gradient (no-op when t does not require grad).
void accumulate_grad(const Tensor& t, const Tensor& g);

/// Runs backward from `root` with d(objective)/d(root) = `grad_output` (shape of root). For a
/// scalar root, pass an undefined tensor to use 1. Frees the graph as it goes.
void backward(const Tensor& root, const Tensor& grad_output = Tensor());

/// The value of a one-element upstream gradient inside a backward function (a loss's scale). The
/// implicit 1 that backward() makes for a scalar root is known on the host, so reading it copies
/// nothing from the device (no host synchronization inside a CUDA step); any other is read with
/// Tensor::item(). Throws std::invalid_argument when `dl` has more than one element.
float scalar_upstream(const Tensor& dl);

}  // namespace mfsdp
