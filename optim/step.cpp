#include "optim/step.h"

#include <string>

#include "optim/clip.h"
#include "optim/step_cuda.h"

namespace mfsdp {
namespace {

// All tensors of one call on one device, each with the expected number of elements.
Device common_device(const char* op, std::initializer_list<std::pair<const Tensor*, int64_t>> args) {
  Device d = args.begin()->first->device();
  for (const auto& [t, numel] : args) {
    check_arg(t->defined() && t->dtype() == DType::f32, op, "expected defined f32 tensors");
    check_arg(t->device() == d, op, "tensors on different devices: " + args.begin()->first->describe() + " and " +
                                        t->describe());
    check_arg(t->numel() == numel, op, t->describe() + " should have " + std::to_string(numel) + " elements");
  }
  return d;
}

// The CUDA kernels implement Keller Jordan's Newton-Schulz only.
void check_cuda_orthogonalizer(const MuonOptions& opt, const char* op) {
  check_arg(opt.orthogonalizer == Orthogonalizer::newton_schulz5, op,
            std::string("orthogonalizer ") + orthogonalizer_name(opt.orthogonalizer) +
                " is implemented on the CPU only; CUDA tensors run newton_schulz5");
}

}  // namespace

void muon_momentum(const Tensor& G, const Tensor& M, const Tensor& U, const MuonOptions& opt) {
  const int64_t n = G.numel();
  if (common_device("muon_momentum", {{&G, n}, {&M, n}, {&U, n}}) == Device::CPU) {
    muon_momentum_cpu(G.data_f32(), M.data_f32(), U.data_f32(), n, opt);
    return;
  }
  cuda_step::muon_momentum(G, M, U, opt);
}

void muon_orthogonalize(const Tensor& U, const Tensor& O, int64_t rows, int64_t cols, int64_t blocks,
                        const MuonOptions& opt) {
  check_arg(blocks >= 1 && rows % blocks == 0, "muon_orthogonalize",
            std::to_string(rows) + " rows in " + std::to_string(blocks) + " blocks");
  const Device d = common_device("muon_orthogonalize", {{&U, rows * cols}, {&O, rows * cols}});
  const int64_t brows = rows / blocks;
  if (d == Device::CPU) {
    orthogonalize_strided_cpu(U.data_f32(), O.data_f32(), blocks, brows, cols, opt.ns_steps, opt.orthogonalizer,
                              opt.ns_dtype);
    return;
  }
  check_cuda_orthogonalizer(opt, "muon_orthogonalize");
  cuda_step::muon_orthogonalize(U, O, blocks, brows, cols, opt);
}

void normuon_normalize(const Tensor& O, const Tensor& v, int64_t rows, int64_t cols, int64_t blocks,
                       const MuonOptions& opt) {
  check_arg(blocks >= 1 && rows % blocks == 0, "normuon_normalize",
            std::to_string(rows) + " rows in " + std::to_string(blocks) + " blocks");
  const Device d = common_device("normuon_normalize", {{&O, rows * cols}, {&v, rows}});
  check_arg(d == Device::CPU, "normuon_normalize",
            "variant normuon is implemented on the CPU only; use variant muon with CUDA tensors");
  const int64_t brows = rows / blocks;
  for (int64_t b = 0; b < blocks; ++b)
    normuon_normalize_cpu(O.data_f32() + b * brows * cols, v.data_f32() + b * brows, brows, cols, opt.beta2,
                          opt.normuon_eps);
}

void muon_apply(const Tensor& W, const Tensor& O, double lr, double scale, double weight_decay) {
  const int64_t n = W.numel();
  if (common_device("muon_apply", {{&W, n}, {&O, n}}) == Device::CPU) {
    muon_apply_update_cpu(W.data_f32(), O.data_f32(), n, lr, scale, weight_decay);
    return;
  }
  cuda_step::muon_apply(W, O, lr, scale, weight_decay);
}

void muon_step(const Tensor& W, const Tensor& G, const Tensor& M, int64_t rows, int64_t cols, double lr,
               const MuonOptions& opt, int qkv_blocks) {
  const int64_t n = rows * cols;
  if (common_device("muon_step", {{&W, n}, {&G, n}, {&M, n}}) == Device::CPU) {
    muon_step_cpu(W.data_f32(), G.data_f32(), M.data_f32(), rows, cols, lr, opt, qkv_blocks);
    return;
  }
  check_cuda_orthogonalizer(opt, "muon_step");
  cuda_step::muon_step(W, G, M, rows, cols, lr, opt, qkv_blocks);
}

void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, int64_t step,
                const AdamWOptions& opt) {
  const int64_t n = p.numel();
  if (common_device("adamw_step", {{&p, n}, {&g, n}, {&m, n}, {&v, n}}) == Device::CPU) {
    adamw_step_cpu(p.data_f32(), g.data_f32(), m.data_f32(), v.data_f32(), n, lr, step, opt);
    return;
  }
  cuda_step::adamw_step(p, g, m, v, lr, step, opt);
}

void add_sum_of_squares(const std::vector<Tensor>& xs, ExactSum& acc) {
  std::vector<const Tensor*> live;
  for (const Tensor& x : xs)
    if (x.defined() && x.numel() > 0) live.push_back(&x);
  if (live.empty()) return;
  const Device d = live[0]->device();
  for (const Tensor* x : live)
    check_arg(x->dtype() == DType::f32 && x->device() == d, "add_sum_of_squares",
              "expected f32 tensors on one device: " + live[0]->describe() + " and " + x->describe());
  if (d == Device::CPU) {
    for (const Tensor* x : live) exact_sum_of_squares_cpu(x->data_f32(), x->numel(), acc);
    return;
  }
  cuda_step::add_sum_of_squares(live, acc);
}

void add_sum_of_squares(const Tensor& x, ExactSum& acc) {
  if (common_device("add_sum_of_squares", {{&x, x.numel()}}) == Device::CPU) {
    exact_sum_of_squares_cpu(x.data_f32(), x.numel(), acc);
    return;
  }
  cuda_step::add_sum_of_squares(x, acc);
}

}  // namespace mfsdp
