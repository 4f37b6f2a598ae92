#include "apps/train/model_io.h"

#include <spdlog/spdlog.h>

#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "models/llama.h"
#include "models/llama_hf.h"
#include "models/moe.h"
#include "models/moe_hf.h"

namespace mfsdp {
namespace {

// What differs between the families, by config type.
std::string describe_family(const GPTConfig& c) {
  return fmt::format("GPT {} layers, {} heads, width {}, context {}, vocab {} (padded {}), {:.2f}M parameters",
                     c.n_layer, c.n_head, c.n_embd, c.seq_len, c.vocab_size, c.padded_vocab_size(), c.num_params() / 1e6);
}
std::string describe_family(const LlamaConfig& c) {
  return fmt::format("Llama {} layers, {} heads ({} key/value), width {}, SwiGLU {}, context {}, vocab {} (padded {}), "
                     "{} head, {:.2f}M parameters",
                     c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.intermediate_size, c.seq_len, c.vocab_size,
                     c.padded_vocab_size(), c.tie_embeddings ? "tied" : "untied", c.num_params() / 1e6);
}
std::string describe_family(const MoeConfig& c) {
  return fmt::format("MoE (Qwen2-MoE) {} layers, {} heads ({} key/value), width {}, {} experts of SwiGLU {} (top {}{}), "
                     "shared expert {}, context {}, vocab {} (padded {}), {} head, {:.2f}M parameters ({:.2f}M active)",
                     c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.num_experts, c.moe_intermediate_size,
                     c.num_experts_per_tok, c.norm_topk_prob ? ", renormalised" : "", c.shared_expert_intermediate_size,
                     c.seq_len, c.vocab_size, c.padded_vocab_size(), c.tie_embeddings ? "tied" : "untied",
                     c.num_params() / 1e6, c.num_active_params() / 1e6);
}
ParamReader open_family(const GPTConfig& c, const std::string& path) { return open_hf_gpt2(path, c); }
ParamReader open_family(const LlamaConfig& c, const std::string& path) { return open_hf_llama(path, c); }
void export_family(const GPTConfig& c, const std::string& path, const ParamSource& p,
                   const std::map<std::string, std::string>& meta) {
  export_hf_gpt2(path, c, p, DType::f32, meta);
}
void export_family(const LlamaConfig& c, const std::string& path, const ParamSource& p,
                   const std::map<std::string, std::string>& meta) {
  export_hf_llama(path, c, p, DType::f32, meta);
}
std::string init_from_mismatch_family(const GPTConfig& c, const std::string& path) {
  const GPTConfig f = read_hf_gpt2_config(path);
  if (f.n_head != c.n_head)  // shapes cannot tell heads apart
    return "was trained with n_head " + std::to_string(f.n_head) + ", model.n_head is " + std::to_string(c.n_head);
  return "";
}
std::string init_from_mismatch_family(const LlamaConfig& c, const std::string& path) {
  const HfCheckpoint ck(path);  // a directory's config.json is checked by the import
  return ck.config().is_null() ? "" : hf_llama_config_mismatch(ck.config(), c);
}
ParamReader open_family(const MoeConfig& c, const std::string& path) { return open_hf_moe(path, c); }
void export_family(const MoeConfig& c, const std::string& path, const ParamSource& p,
                   const std::map<std::string, std::string>& meta) {
  export_hf_moe(path, c, p, DType::f32, meta);
}
std::string init_from_mismatch_family(const MoeConfig& c, const std::string& path) {
  const HfCheckpoint ck(path);  // a directory's config.json is checked by the import
  return ck.config().is_null() ? "" : hf_moe_config_mismatch(ck.config(), c);
}
int32_t start_token_family(const MoeConfig&) { return 0; }
const char* layout_family(const MoeConfig& c) {
  return hf_moe_is_mixtral(c) ? "Hugging Face Mixtral" : "Hugging Face Qwen2-MoE";
}
int32_t start_token_family(const GPTConfig& c) { return c.vocab_size > 50256 ? 50256 : 0; }
int32_t start_token_family(const LlamaConfig&) { return 0; }
const char* layout_family(const GPTConfig&) { return "Hugging Face GPT-2"; }
const char* layout_family(const LlamaConfig&) { return "Hugging Face Llama"; }

template <class Model, class Config>
class Trainable final : public TrainableModel {
 public:
  explicit Trainable(const Config& cfg) : cfg_(cfg), model_(cfg) {}
  UnitModel& units() override { return model_; }
  const ParamInventory& inventory() const override { return model_.inventory(); }
  std::string describe() const override { return describe_family(cfg_); }
  double flops_per_token() const override { return cfg_.flops_per_token(cfg_.seq_len); }
  int64_t num_params() const override { return cfg_.num_params(); }
  MemoryModel memory_model() const override {
    return {cfg_.n_layer, cfg_.n_embd, cfg_.n_head, static_cast<int64_t>(cfg_.padded_vocab_size())};
  }
  ParamReader open_weights(const std::string& path) const override { return open_family(cfg_, path); }
  std::string init_from_mismatch(const std::string& path) const override { return init_from_mismatch_family(cfg_, path); }
  void export_weights(const std::string& path, const ParamSource& params,
                      const std::map<std::string, std::string>& metadata) const override {
    export_family(cfg_, path, params, metadata);
  }
  int32_t start_token() const override { return start_token_family(cfg_); }
  const char* export_layout() const override { return layout_family(cfg_); }
  std::vector<std::vector<int64_t>> take_expert_counts() override {
    if constexpr (requires(Model& m) { m.take_expert_counts(); }) return model_.take_expert_counts();
    else return {};
  }

 private:
  Config cfg_;
  Model model_;
};

}  // namespace

std::unique_ptr<TrainableModel> make_trainable_model(const TrainConfig& cfg) {
  if (cfg.model.arch == "llama") return std::make_unique<Trainable<Llama, LlamaConfig>>(cfg.model.llama());
  if (cfg.model.arch == "qwen2_moe") return std::make_unique<Trainable<MoeTransformer, MoeConfig>>(cfg.model.moe());
  return std::make_unique<Trainable<GPT, GPTConfig>>(cfg.model.gpt());
}

}  // namespace mfsdp
