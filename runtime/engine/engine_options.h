// The engine's options, its per-step report and its errors.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "optim/adamw.h"
#include "optim/muon.h"
#include "optim/schedule.h"

namespace mfsdp {

/// Optimizer and step hyperparameters of the engine.
/// AdamW weight decay applies to 2-D AdamW tensors (embeddings, untied head) only; norms and
/// biases are never decayed (the nanoGPT/GPT-2 convention). Muon decays its matrices.
struct EngineOptions {
  MuonOptions muon;
  AdamWOptions adamw;
  double muon_lr = 0.02;   ///< base learning rate of the Muon group
  double adamw_lr = 3e-3;  ///< base learning rate of the AdamW group
  LRSchedule schedule;     ///< both groups follow it, each from its own base lr
  double grad_clip = 1.0;  ///< global-norm clipping threshold on raw gradients (<= 0 disables)
};

/// Thrown by train_step when the global loss or the global gradient norm is NaN or Inf (checked
/// before any optimizer step, with clipping on or off); parameters and optimizer state are left
/// untouched. The message names the step, the value and, for the gradient, the first tensor (in
/// plan order) whose gradient is not finite on some rank.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What one optimizer step did, the same on every rank. loss is the mean over every rank's tokens
/// and micro-batches; grad_norm is the global norm before clipping. Phase times are seconds, the
/// maximum over ranks (the slowest rank sets the pace); t_total is the whole step on the slowest rank.
struct StepStats {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, clip_coef = 1, lr_muon = 0, lr_adamw = 0;
  double t_forward = 0, t_backward = 0, t_reduce = 0, t_optimizer = 0, t_total = 0;
  int64_t tokens = 0;  ///< tokens in the global batch
};

/// One kind of per-element training state: the parameter itself, the first optimizer moment
/// (Muon momentum or AdamW m) and AdamW's second moment v. Names: "param", "m", "v".
enum class StateKind : int { param = 0, m = 1, v = 2 };
const char* state_kind_name(StateKind k);

}  // namespace mfsdp
