#include "planner/param_spec.h"

#include <stdexcept>

namespace mfsdp {

const char* param_role_name(ParamRole r) {
  switch (r) {
    case ParamRole::matrix: return "matrix";
    case ParamRole::embedding: return "embedding";
    case ParamRole::head: return "head";
    case ParamRole::norm: return "norm";
    case ParamRole::bias: return "bias";
    case ParamRole::router: return "router";
  }
  throw std::invalid_argument("[param_role_name] unknown role value " +
                              std::to_string(static_cast<int>(r)));
}

ParamRole parse_param_role(const std::string& s) {
  for (ParamRole r : {ParamRole::matrix, ParamRole::embedding, ParamRole::head, ParamRole::norm,
                      ParamRole::bias, ParamRole::router})
    if (s == param_role_name(r)) return r;
  throw std::invalid_argument("[parse_param_role] unknown role '" + s +
                              "' (expected matrix, embedding, head, norm, bias or router)");
}

}  // namespace mfsdp
