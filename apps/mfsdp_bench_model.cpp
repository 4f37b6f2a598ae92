// mfsdp-bench-model: one-rank forward + backward + AdamW step time of a GPT on a CPU rank or one CUDA
// device (--device), with f32 or bf16 matmuls (--dtype bf16: bf16 operands, f32 accumulation, as
// precision.matmul_dtype = bf16 runs them; auto: as precision.matmul_dtype auto decides). Prints the median step time and its phases over the
// measured steps, the achieved TFLOP/s, tokens/s, MFU against --peak-tflops, and the peak memory
// of the measured steps (training FLOPs = GPTConfig::flops_per_token(T) x B x T, PaLM appendix B).
// --attention picks the attention kernel as runtime.attention does (auto: resolve_attention's
// rule, cudnn for bf16 matmuls on CUDA when the build has it); the header line names the kernel.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli_common.h"
#include "models/gpt.h"
#include "models/model_presets.h"
#include "optim/adamw.h"
#include "optim/step.h"
#include "runtime/engine/resolve.h"
#include "runtime/autograd.h"
#include "runtime/cpu_gemm_bf16.h"
#include "runtime/cuda/device_api.h"
#include "runtime/gemm_probe.h"
#include "runtime/memory.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

/// The command line: the model's shape and the run (batch, sequence, steps, threads, matmul dtype).
struct ModelBenchArgs {
  GPTConfig cfg;
  int B = 4, T = 64, warmup = 2, steps = 5, threads = 0;
  std::optional<DType> dtype = DType::f32;  ///< the matmul dtype; unset (auto) until main resolves it
  Device device = Device::CPU;
  std::optional<AttentionKernel> attention;  ///< unset: resolve_attention's choice
  double peak_tflops = 0.0;  // 0: the device's default (kCudaPeakTflops on CUDA, the probed rate on CPU)
  GemmRates probed;          // CPU: the GEMM probe at the run's shape (runtime/gemm_probe.h)
  ModelBenchArgs() : cfg(model_preset("gpt2-124m").gpt_config()) {}
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
  cli::add_choice(app, "--dtype", a.dtype, kAutoDTypeNames,
                  "matmul operand dtype: f32, bf16 or auto (as precision.matmul_dtype: the faster by the GEMM probe "
                  "on CPU, bf16 on CUDA)");
  cli::add_choice(app, "--device", a.device, kDeviceNames, "cpu (one CPU rank) or cuda (CUDA device 0)");
  cli::add_choice(app, "--attention", a.attention, kAttentionNames,
                  "attention kernel: auto, cudnn, fused or unfused (as runtime.attention)");
  app.add_option("--peak-tflops", a.peak_tflops,
                 "peak TFLOP/s for the MFU (0 = 989, the dense bf16 peak of an H100/H200, on CUDA; the probed GEMM "
                 "rate of the matmul dtype on CPU)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
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
  const Device dev = a.device;
  GPT model(cfg);
  model.allocate_local(1, dev);
  const int64_t n = model.local_params().numel();
  Tensor m = Tensor::zeros({n}, DType::f32, dev), v = Tensor::zeros({n}, DType::f32, dev);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = (i * 7919) % cfg.vocab_size;
    tgt[i] = (i * 104729 + 1) % cfg.vocab_size;
  }
  Tensor tokens = tokens_tensor(tok, {B, T}, dev), targets = tokens_tensor(tgt, {B, T}, dev);
  AdamWOptions opt;
  opt.weight_decay = 0.1;
  const DType mm = a.dtype.value();  // main resolved auto
  MatmulDTypeScope matmul_dtype(mm);
  AttentionKernelScope attention(resolve_attention(a.attention, dev, mm,
                                                   cfg.n_embd / cfg.n_head, cudnn_attention_built()));
  const bool cpu_bf16 = dev == Device::CPU && mm == DType::bf16;
  std::printf("GPT n_layer=%d n_head=%d n_embd=%d vocab=%d (padded %lld), %lld parameters, B=%d T=%d, %s, "
              "%s matmuls%s%s, %s attention\n",
              cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, static_cast<long long>(cfg.padded_vocab_size()),
              static_cast<long long>(n), B, T,
              dev == Device::CUDA ? "CUDA device 0" : (std::to_string(cpu_threads()) + " threads").c_str(),
              dtype_name(mm), cpu_bf16 ? ": " : "", cpu_bf16 ? cpu_gemm_bf16_path() : "",
              kAttentionKernelNames.name(attention_kernel()));
  // Phase boundaries wait for the device, so each phase's time is its own work.
  auto now = [dev] {
    if (dev == Device::CUDA) cuda::synchronize();
    return std::chrono::steady_clock::now();
  };
  StepTimes times;
  for (int s = 0; s < warmup + a.steps; ++s) {
    if (s == warmup) MemoryTracker::instance().reset_peaks();
    auto t0 = now();
    model.local_grads().zero();
    Tensor loss = model.forward_loss(tokens, targets);
    auto t1 = now();
    backward(loss);
    auto t2 = now();
    adamw_step(model.local_params(), model.local_grads(), m, v, 1e-4, s + 1, opt);
    auto t3 = now();
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
  const bool on_cuda = args.device == Device::CUDA;
  if (!on_cuda) {  // the probe precision.matmul_dtype auto decides from, at this run's MLP shape
    args.probed = probe_cpu_gemm_rates({int64_t(args.B) * args.T, 4 * int64_t(args.cfg.n_embd), args.cfg.n_embd});
    std::printf("GEMM probe at %d threads: %s\n", cpu_threads(), describe_rates(args.probed).c_str());
  }
  if (!args.dtype) args.dtype = on_cuda || bf16_pays(args.probed) ? DType::bf16 : DType::f32;
  if (on_cuda && !cuda::available()) {
    std::fprintf(stderr, "mfsdp-bench-model: --device cuda: %s\n",
                 cuda::built() ? "no CUDA device is visible" : "this build has no CUDA (configure with MFSDP_CUDA=ON)");
    return 2;
  }

  StepTimes t;
  try {
    t = time_model_steps(args);
  } catch (const OptionError& e) {  // --attention cudnn where it cannot run
    std::fprintf(stderr, "mfsdp-bench-model: --attention %s: %s\n", kAttentionNames.name(args.attention),
                 e.message([](OptionField f) { return std::string(kOptionFieldNames.name(f)); }).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-bench-model: %s\n", e.what());
    return 1;
  }
  const int B = args.B, T = args.T;
  const double med = median(t.total);
  const double tflops = args.cfg.flops_per_token(T) * B * T / (med * 1e-3) / 1e12;
  const double probed = (args.dtype == DType::bf16 ? args.probed.bf16 : args.probed.f32) / 1e3;
  const double peak = args.peak_tflops > 0 ? args.peak_tflops : on_cuda ? kCudaPeakTflops : probed;
  const Device dev = on_cuda ? Device::CUDA : Device::CPU;
  std::printf("\nmedian over %d steps: %.1f ms/step (forward %.1f, backward %.1f, adamw %.1f), %.3f TFLOP/s, "
              "%.0f tokens/s",
              args.steps, med, median(t.fwd), median(t.bwd), median(t.upd), tflops, B * T / (med * 1e-3));
  if (peak > 0) std::printf(", MFU %.1f%% of %.3g TFLOP/s", 100.0 * tflops / peak, peak);
  std::printf(", peak memory %.1f MiB\n", MemoryTracker::instance().peak_total(dev) / 1048576.0);
  return 0;
}
