// mfsdp-bench-model: one-rank forward + backward + AdamW step time of a GPT on CPU, with f32 or bf16
// matmuls (--dtype bf16: bf16 operands, f32 accumulation, as precision.param_dtype = bf16 runs them).
// Prints the median step time over the measured steps and the achieved GFLOP/s
// (training FLOPs = GPTConfig::flops_per_token(T) x B x T, PaLM appendix B).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli_common.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "runtime/autograd.h"
#include "runtime/cpu_gemm_bf16.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

/// The command line: the model's shape and the run (batch, sequence, steps, threads, matmul dtype).
struct ModelBenchArgs {
  GPTConfig cfg;
  int B = 4, T = 64, warmup = 2, steps = 5, threads = 0;
  std::string dtype = "f32";
  ModelBenchArgs() {
    cfg.n_layer = 12;
    cfg.n_head = 12;
    cfg.n_embd = 768;
    cfg.seq_len = 1024;
    cfg.vocab_size = 50257;
  }
};

/// Declares every option of mfsdp-bench-model on `app`, bound to the fields of `a`.
void add_model_bench_options(CLI::App& app, ModelBenchArgs& a) {
  GPTConfig& cfg = a.cfg;
  app.add_option("--n-layer", cfg.n_layer, "transformer blocks")->capture_default_str()->check(CLI::Range(1, cli::kMaxLayers));
  app.add_option("--n-head", cfg.n_head, "attention heads")->capture_default_str()->check(CLI::Range(1, 1 << 12));
  app.add_option("--n-embd", cfg.n_embd, "model width")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--vocab", cfg.vocab_size, "vocabulary size (padded to a multiple of 64)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 22));
  app.add_option("-B,--batch", a.B, "sequences per step")->capture_default_str()->check(CLI::Range(1, cli::kMaxBatch));
  app.add_option("-T,--seq", a.T, "sequence length")->capture_default_str()->check(CLI::Range(1, cli::kMaxSeq));
  app.add_option("--warmup", a.warmup, "untimed steps")->capture_default_str()->check(CLI::Range(0, cli::kMaxSteps));
  app.add_option("--steps", a.steps, "timed steps (>= 1)")->capture_default_str()->check(CLI::Range(1, cli::kMaxSteps));
  app.add_option("--threads", a.threads, "CPU threads (0 = all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, cli::kMaxThreads));
  app.add_option("--dtype", a.dtype, "matmul operand dtype: f32 or bf16")->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
}

/// Milliseconds of each measured step, per phase.
struct StepTimes {
  std::vector<double> fwd, bwd, upd, total;
};

/// Builds the GPT of `a.cfg` on one rank and runs warm-up + measured steps of forward, backward
/// and AdamW on fixed tokens, printing one line per step. Returns the measured steps' times.
StepTimes time_model_steps(const ModelBenchArgs& a) {
  const GPTConfig& cfg = a.cfg;
  const int B = a.B, T = a.T, warmup = a.warmup;
  GPT model(cfg);
  model.allocate_local(1);
  const int64_t n = model.local_params().numel();
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = (i * 7919) % cfg.vocab_size;
    tgt[i] = (i * 104729 + 1) % cfg.vocab_size;
  }
  Tensor tokens = tokens_tensor(tok, {B, T}), targets = tokens_tensor(tgt, {B, T});
  AdamWOptions opt;
  opt.weight_decay = 0.1;
  MatmulDTypeScope matmul_dtype(a.dtype == "bf16" ? DType::bf16 : DType::f32);
  std::printf("GPT n_layer=%d n_head=%d n_embd=%d vocab=%d (padded %lld), %lld parameters, B=%d T=%d, %d threads, "
              "%s matmuls%s%s\n",
              cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, static_cast<long long>(cfg.padded_vocab_size()),
              static_cast<long long>(n), B, T, cpu_threads(), a.dtype.c_str(), a.dtype == "bf16" ? ": " : "",
              a.dtype == "bf16" ? cpu_gemm_bf16_path() : "");
  StepTimes times;
  for (int s = 0; s < warmup + a.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    model.local_grads().zero();
    Tensor loss = model.forward_loss(tokens, targets);
    auto t1 = std::chrono::steady_clock::now();
    backward(loss);
    auto t2 = std::chrono::steady_clock::now();
    adamw_step_cpu(model.local_params().data_f32(), model.local_grads().data_f32(), m.data_f32(), v.data_f32(), n,
                   1e-4, s + 1, opt);
    auto t3 = std::chrono::steady_clock::now();
    auto ms = [](auto x, auto y) { return std::chrono::duration<double, std::milli>(y - x).count(); };
    std::printf("step %d: loss %.4f  forward %.0f ms  backward %.0f ms  adamw %.0f ms  total %.0f ms%s\n", s,
                loss.item(), ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t0, t3), s < warmup ? "  (warm-up)" : "");
    if (s >= warmup) {
      times.fwd.push_back(ms(t0, t1));
      times.bwd.push_back(ms(t1, t2));
      times.upd.push_back(ms(t2, t3));
      times.total.push_back(ms(t0, t3));
    }
  }
  return times;
}

/// Median of `x` (the mean of the middle two for an even count); `x` is not empty.
double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times forward + backward + AdamW of a GPT on one CPU rank"};
  ModelBenchArgs args;
  add_model_bench_options(app, args);
  if (const int rc = cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;
  args.cfg.seq_len = std::max(args.cfg.seq_len, args.T);
  try {
    args.cfg.validate();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-bench-model: %s\n", e.what());
    return 2;
  }
  if (args.threads > 0) set_cpu_threads(args.threads);

  const StepTimes t = time_model_steps(args);
  const int B = args.B, T = args.T;
  const double med = median(t.total);
  const double flops = args.cfg.flops_per_token(T) * B * T;
  std::printf("\nmedian over %d steps: %.1f ms/step (forward %.1f, backward %.1f, adamw %.1f), %.1f GFLOP/s, %.0f tokens/s\n",
              args.steps, med, median(t.fwd), median(t.bwd), median(t.upd), flops / (med * 1e-3) / 1e9,
              B * T / (med * 1e-3));
  return 0;
}
