#include "apps/train/model_io.h"

#include <spdlog/spdlog.h>

#include "models/gpt.h"
#include "models/gpt_hf.h"

namespace mfsdp {
namespace {

class TrainableGPT final : public TrainableModel {
 public:
  explicit TrainableGPT(const GPTConfig& cfg) : cfg_(cfg), model_(cfg) {}
  UnitModel& units() override { return model_; }
  std::string describe() const override {
    return fmt::format("GPT {} layers, {} heads, width {}, context {}, vocab {} (padded {}), {:.2f}M parameters",
                       cfg_.n_layer, cfg_.n_head, cfg_.n_embd, cfg_.seq_len, cfg_.vocab_size, cfg_.padded_vocab_size(),
                       cfg_.num_params() / 1e6);
  }
  double flops_per_token() const override { return cfg_.flops_per_token(cfg_.seq_len); }
  int64_t num_params() const override { return cfg_.num_params(); }
  TensorMap import_weights(const std::string& path) const override { return import_hf_gpt2(path, cfg_); }
  void export_weights(const std::string& path, const TensorMap& params,
                      const std::map<std::string, std::string>& metadata) const override {
    export_hf_gpt2(path, cfg_, params, DType::f32, metadata);
  }
  std::vector<int32_t> sample(const std::vector<int32_t>& prompt, int n, float temperature,
                              uint64_t seed) const override {
    return sample_tokens(model_, prompt, n, temperature, 0, seed);
  }
  int32_t start_token() const override { return cfg_.vocab_size > 50256 ? 50256 : 0; }
  const char* export_layout() const override { return "Hugging Face GPT-2"; }

 private:
  GPTConfig cfg_;
  GPT model_;
};

}  // namespace

std::unique_ptr<TrainableModel> make_trainable_model(const TrainConfig& cfg) {
  return std::make_unique<TrainableGPT>(cfg.model.gpt());
}

}  // namespace mfsdp
