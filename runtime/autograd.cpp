#include "runtime/autograd.h"

#include <unordered_set>

#include "runtime/kernels.h"

namespace mfsdp {

namespace {
thread_local bool t_grad_enabled = true;
thread_local const void* t_implicit_root_grad = nullptr;  // id of backward()'s implicit 1, while it runs

// Marks backward()'s implicit root gradient for scalar_upstream, until the pass ends or throws.
class ImplicitRootGrad {
 public:
  explicit ImplicitRootGrad(const void* id) : prev_(t_implicit_root_grad) { t_implicit_root_grad = id; }
  ~ImplicitRootGrad() { t_implicit_root_grad = prev_; }
  ImplicitRootGrad(const ImplicitRootGrad&) = delete;
  ImplicitRootGrad& operator=(const ImplicitRootGrad&) = delete;

 private:
  const void* prev_;
};
}  // namespace

bool grad_mode_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(Tensor& out, const char* name, std::vector<Tensor> inputs,
            std::function<void(const Tensor&)> backward_fn) {
  out.set_grad_fn(std::make_shared<Node>(name, std::move(inputs), std::move(backward_fn)));
}

Tensor grad_buffer(const Tensor& t) {
  Tensor g = t.grad();
  if (!g.defined()) {  // charged to the caller's current category (activations during backward)
    g = Tensor::zeros(t.shape(), DType::f32, t.device());
    t.set_grad(g);
  }
  return g;
}

GradTarget grad_target(const Tensor& t) {
  if (Tensor g = t.grad(); g.defined()) return {g, 1.0f};
  Tensor g = Tensor::empty(t.shape(), DType::f32, t.device());  // charged as grad_buffer's
  t.set_grad(g);
  return {g, 0.0f};
}

void accumulate_grad(const Tensor& t, const Tensor& g) {
  if (!t.defined() || !t.requires_grad()) return;
  check_arg(g.numel() == t.numel(), "accumulate_grad", "gradient " + g.describe() + " for " + t.describe());
  Tensor buf = t.grad();
  if (!buf.defined()) {
    // First contribution: take a copy (the producer may reuse its buffer).
    buf = Tensor::empty(t.shape(), DType::f32, t.device());
    buf.copy_from(g);
    t.set_grad(buf);
    return;
  }
  kernels(t.device()).axpy(buf.data_f32(), g.data_f32(), 1.0f, t.numel());
}

void backward(const Tensor& root, const Tensor& grad_output) {
  check_arg(root.defined(), "backward", "undefined root");
  Tensor gout = grad_output;
  const bool implicit = !gout.defined();
  if (implicit) {
    check_arg(root.numel() == 1, "backward", "grad_output is required for non-scalar root " + root.describe());
    gout = Tensor::empty(root.shape(), DType::f32, root.device());
    gout.fill(1.0f);
  }
  ImplicitRootGrad mark(implicit ? gout.id() : t_implicit_root_grad);
  check_arg(gout.shape() == root.shape(), "backward", "grad_output " + gout.describe() + " for root " + root.describe());
  if (!root.grad_fn()) {  // a leaf: its gradient is the given one
    accumulate_grad(root, gout);
    return;
  }
  // Topological order of the tensors whose grad_fn must run (iterative DFS, post-order).
  std::vector<Tensor> order;
  std::unordered_set<const void*> visited;
  std::vector<std::pair<Tensor, size_t>> stack;
  stack.push_back({root, 0});
  visited.insert(root.id());
  while (!stack.empty()) {
    auto& [t, next] = stack.back();
    auto fn = t.grad_fn();
    if (fn && next < fn->inputs().size()) {
      const Tensor& in = fn->inputs()[next++];
      if (in.defined() && in.grad_fn() && visited.insert(in.id()).second) stack.push_back({in, 0});
      continue;
    }
    order.push_back(t);
    stack.pop_back();
  }
  root.set_grad(gout);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Tensor t = *it;
    auto fn = t.grad_fn();
    Tensor g = t.grad();
    if (g.defined()) fn->run_backward(g);
    fn->release();
    t.clear_grad();  // intermediate gradient no longer needed
    t.set_grad_fn(nullptr);
  }
}

float scalar_upstream(const Tensor& dl) {
  check_arg(dl.numel() == 1, "scalar_upstream", "upstream gradient " + dl.describe() + " is not a scalar");
  return t_implicit_root_grad && dl.id() == t_implicit_root_grad ? 1.0f : dl.item();
}

}  // namespace mfsdp
