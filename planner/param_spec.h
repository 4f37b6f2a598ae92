// The parameter inventory: what the planner knows about each parameter before any tensor exists.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mfsdp {

/// Role of a parameter; decides its optimizer: only `matrix` goes to Muon. `router` is a
/// Mixture-of-Experts router or gate matrix ([experts, C], [1, C]), kept on AdamW.
enum class ParamRole : uint8_t { matrix = 0, embedding = 1, head = 2, norm = 3, bias = 4, router = 5 };

const char* param_role_name(ParamRole r);
/// Parses a role name as written by param_role_name; throws std::invalid_argument otherwise.
ParamRole parse_param_role(const std::string& s);

/// One model parameter as the planner sees it.
/// shape is the *logical* (global) shape; for matrices it is [fan_out, fan_in] (PyTorch Linear
/// convention, y = x W^T), which is also how the runtime stores them (row-major).
/// `unit` indexes the FSDP unit that gathers and frees the parameter (0 = embedding unit,
/// 1..n_layer = transformer blocks, n_layer+1 = head unit for GPT).
/// `qkv_blocks` > 1 marks a fused QKV weight whose rows split into that many equal matrices for
/// Newton-Schulz when the split_qkv option is on (still one owner).
/// `expert` >= 0 marks the matrices of one routed Mixture-of-Experts expert (the same number for
/// its gate, up and down projections, unique over the model): under expert parallelism they get
/// one owner together and are never gathered. -1: not an expert matrix.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  ParamRole role = ParamRole::matrix;
  int unit = 0;
  int qkv_blocks = 1;
  int expert = -1;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/// A model's FSDP unit names, in forward order, plus its parameters (each in exactly one unit).
struct ParamInventory {
  std::vector<std::string> unit_names;
  std::vector<ParamSpec> params;
};

}  // namespace mfsdp
