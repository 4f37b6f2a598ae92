// The config structs' own methods: the effective config as JSON (the schema the parser checks
// against is TrainConfig{}.to_json()), the model and checkpoint views of the sections, and the
// training section at a world size (apply_global_batch).
#include <algorithm>
#include <filesystem>
#include <string>

#include "apps/train/train_config.h"

namespace mfsdp {

using json = nlohmann::json;

json TrainConfig::to_json(bool resolved_paths) const {
  auto p = [&](const ConfigPath& c) { return resolved_paths ? c.resolved : c.raw; };
  json j;
  j["model"] = {{"arch", model.arch},
                {"n_layer", model.n_layer},       {"n_head", model.n_head},
                {"n_embd", model.n_embd},         {"seq_len", model.seq_len},
                {"vocab_size", model.vocab_size}, {"tie_embeddings", model.tie_embeddings},
                {"init_from", p(model.init_from)}, {"init_std", model.init_std},
                {"n_kv_head", model.n_kv_head},   {"intermediate_size", model.intermediate_size},
                {"norm_eps", model.norm_eps},     {"rope_theta", model.rope_theta},
                {"num_experts", model.num_experts}, {"num_experts_per_tok", model.num_experts_per_tok},
                {"moe_intermediate_size", model.moe_intermediate_size},
                {"shared_expert_intermediate_size", model.shared_expert_intermediate_size},
                {"norm_topk_prob", model.norm_topk_prob}, {"router_aux_loss_coef", model.router_aux_loss_coef},
                {"router_z_loss_coef", model.router_z_loss_coef}, {"router_optimizer", model.router_optimizer}};
  j["data"] = {{"train", p(data.train)},         {"val", p(data.val)},         {"tokenizer", data.tokenizer},
               {"tokenizer_path", p(data.tokenizer_path)}, {"shuffle", data.shuffle}, {"seed", data.seed}};
  const MuonOptions& mu = optim.muon;
  j["optimizer"]["muon"] = {{"lr", mu.lr},
                            {"momentum", mu.momentum},
                            {"nesterov", mu.nesterov},
                            {"ns_steps", mu.ns_steps},
                            {"weight_decay", mu.weight_decay},
                            {"scale_rule", muon_scale_rule_name(mu.scale_rule)},
                            {"split_qkv", mu.split_qkv},
                            {"orthogonalizer", orthogonalizer_name(mu.orthogonalizer)},
                            {"ns_dtype", kNsChoiceNames.name(precision.ns)},
                            {"variant", muon_variant_name(mu.variant)},
                            {"beta2", mu.beta2},
                            {"split_heads", mu.split_heads},
                            {"qk_clip", optim.qk_clip},
                            {"overlap_backward", optim.overlap_backward}};
  j["optimizer"]["adamw"] = {{"lr", optim.adamw.lr},
                             {"beta1", optim.adamw.beta1},
                             {"beta2", optim.adamw.beta2},
                             {"eps", optim.adamw.eps},
                             {"weight_decay", optim.adamw.weight_decay}};
  j["schedule"] = {{"warmup_steps", optim.schedule.warmup_steps},
                   {"decay", decay_kind_name(optim.schedule.kind)},
                   {"floor", optim.schedule.floor},
                   {"decay_fraction", optim.schedule.decay_fraction}};
  j["runtime"] = {{"device", device_name(runtime.device)}, {"attention", kAttentionNames.name(optim.attention)}};
  j["precision"] = {{"param_dtype", dtype_name(optim.param_dtype)},
                    {"reduce_dtype", dtype_name(optim.reduce_dtype)},
                    {"matmul_dtype", kMatmulChoiceNames.name(precision.matmul)}};
  j["sharding"] = {{"placement", placement_name(sharding.placement)},
                   {"backend", comm_backend_name(sharding.backend)},
                   {"replicate", sharding.replicate},
                   {"prefetch_depth", optim.prefetch_depth.value_or(-1)},
                   {"prefetch_limit_bytes", optim.prefetch_limit_bytes},
                   {"overlap_reduce", kToggleNames.name(optim.overlap_reduce)},
                   {"expert_parallel", optim.expert_parallel},
                   {"memory_check", kMemoryCheckNames.name(sharding.memory_check)},
                   {"debug_checks", sharding.debug_checks},
                   {"nccl_blocking", sharding.nccl_blocking},
                   {"reduce_chunk_bytes", sharding.reduce_chunk_bytes},
                   {"collective_timeout_s", sharding.collective_timeout_s}};
  j["training"] = {{"steps", training.steps},
                   {"micro_batch_size", training.micro_batch_size},
                   {"grad_accum", training.grad_accum},
                   {"global_batch_size", training.global_batch_size ? json(*training.global_batch_size) : json(nullptr)},
                   {"eval_interval", training.eval_interval},
                   {"eval_tokens", training.eval_tokens},
                   {"grad_clip", optim.grad_clip},
                   {"seed", training.seed},
                   {"target_val_loss", training.target_val_loss ? json(*training.target_val_loss) : json(nullptr)},
                   {"sample_tokens", training.sample_tokens},
                   {"recompute", kRecomputeNames.name(optim.recompute_units)},
                   {"resume", training.resume}};
  j["logging"] = {{"interval", logging.interval},       {"peak_tflops", logging.peak_tflops ? json(*logging.peak_tflops) : json(nullptr)},
                  {"run_dir", p(logging.run_dir)},        {"trace", p(logging.trace)},
                  {"trace_start", logging.trace_start}, {"trace_steps", logging.trace_steps}};
  j["output"] = {{"export", p(output.export_path)}};
  j["checkpoint"] = {{"dir", p(checkpoint.dir)},
                     {"interval", checkpoint.interval},
                     {"keep_last", checkpoint.keep_last},
                     {"at_end", checkpoint.at_end},
                     {"notice_signal", checkpoint.notice_signal}};
  return j;
}

std::string CheckpointSection::root(const std::string& run_dir) const {
  if (!dir.resolved.empty()) return dir.resolved;
  if (run_dir.empty()) return "";
  return (std::filesystem::path(run_dir) / "checkpoints").string();
}

LlamaConfig ModelSection::llama() const {
  LlamaConfig l;
  l.n_layer = n_layer;
  l.n_head = n_head;
  l.n_kv_head = n_kv_head > 0 ? n_kv_head : n_head;
  l.n_embd = n_embd;
  l.intermediate_size = intermediate_size > 0 ? intermediate_size : (8 * n_embd / 3 + 255) / 256 * 256;
  l.seq_len = seq_len;
  l.vocab_size = static_cast<int>(vocab_size);
  l.tie_embeddings = tie_embeddings;
  l.init_std = init_std;
  l.norm_eps = norm_eps;
  l.rope_theta = rope_theta;
  return l;
}

MoeConfig ModelSection::moe() const {
  MoeConfig m;
  static_cast<LlamaConfig&>(m) = llama();
  m.num_experts = num_experts;
  m.num_experts_per_tok = num_experts_per_tok;
  m.moe_intermediate_size = moe_intermediate_size > 0
                                ? moe_intermediate_size
                                : (m.intermediate_size + num_experts_per_tok - 1) / std::max(1, num_experts_per_tok);
  m.shared_expert_intermediate_size = shared_expert_intermediate_size;
  m.norm_topk_prob = norm_topk_prob;
  m.router_aux_loss_coef = router_aux_loss_coef;
  m.router_z_loss_coef = router_z_loss_coef;
  m.router_on_muon = router_optimizer == "muon";
  return m;
}

ParamInventory ModelSection::inventory() const {
  if (arch == "llama") return llama_inventory(llama());
  if (arch == "qwen2_moe") return moe_inventory(moe());
  return gpt_inventory(gpt());
}

ModelFacts ModelSection::facts() const {
  const bool gpt = arch == "gpt2";  // models/gpt.h reports its heads; models/llama.h and moe.h do not
  const int64_t head_size = n_head > 0 ? n_embd / n_head : 0;  // both: n_embd / n_head features per head
  return {gpt ? head_size : 0, gpt, head_size};
}

GPTConfig ModelSection::gpt() const {
  GPTConfig g;
  g.n_layer = n_layer;
  g.n_head = n_head;
  g.n_embd = n_embd;
  g.seq_len = seq_len;
  g.vocab_size = static_cast<int>(vocab_size);
  g.tie_embeddings = tie_embeddings;
  g.init_std = init_std;
  return g;
}

std::string apply_global_batch(TrainConfig& cfg, int world_size) {
  if (!cfg.training.global_batch_size) return "";
  const int64_t G = *cfg.training.global_batch_size, B = cfg.training.micro_batch_size, W = world_size;
  if (G % (W * B) == 0 && G / (W * B) <= (1 << 20)) {
    cfg.training.grad_accum = static_cast<int>(G / (W * B));
    return "";
  }
  std::string fits;  // world sizes W' with G = W' x B x A for a whole A
  int listed = 0;
  for (int64_t w = 1; G % B == 0 && w <= G / B && listed < 12; ++w)
    if ((G / B) % w == 0 && G / (w * B) <= (1 << 20)) fits += (listed++ ? ", " : "") + std::to_string(w);
  return cfg.source + ": training.global_batch_size " + std::to_string(G) + " is not divisible by world size " +
         std::to_string(W) + " x training.micro_batch_size " + std::to_string(B) + " (= " + std::to_string(W * B) + ")" +
         (fits.empty() ? "; no world size divides it at this micro-batch size (change training.micro_batch_size)"
                       : "; world sizes that divide it: " + fits + (listed == 12 ? ", ..." : ""));
}

}  // namespace mfsdp
