// cuDNN fused attention (cudnn_attention.h) through the cuDNN C++ frontend's graph API. The one
// translation unit that includes the (header-only) frontend, compiled by the host compiler.
//
// Per shape (B, T, H, Hkv, d) and direction, one graph is built and kept: bf16 input/output,
// f32 intermediates and compute, tensors Q/K/V/O (and dO/dQ/dK/dV) of dims [B, heads, T, d] with
// the strides of a [B, T, heads, d] buffer, the f32 statistics [B, H, T, 1], attn_scale 1/sqrt(d)
// and the causal mask with top-left diagonal alignment (key j <= query i). cuDNN's GQA maps query
// head h to key/value head h / (H/Hkv), the project's convention (kernels.h). The backward asks for
// the deterministic algorithm. One cuDNN handle per process, bound to the caller's stream (the
// runtime's compute stream); one grow-only workspace shared by every plan (calls are serialized by
// a mutex). A shared library of its own: it needs only cuDNN and the CUDA runtime.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "runtime/cuda/cudnn_attention.h"

#define CUDNN_FRONTEND_SKIP_JSON_LIB 1  // the project's nlohmann-json is another version; no JSON needed here
#include <cudnn_frontend.h>

// The frontend's plan list carries an experimental engine (RMSNorm + SiLU on sm_100) that compiles
// its kernel with NVRTC, registered only under HeurMode_t::OPENSOURCE, which the plans here never
// ask for. These stand-ins answer every NVRTC call with NVRTC_ERROR_INTERNAL_ERROR, as the
// frontend's own dynamic-loading build does when libnvrtc is absent, so this library links no
// libnvrtc. Hidden: they bind this library's references at link time, are not exported, and never
// interpose a real NVRTC elsewhere in the process. cuDNN itself still needs NVRTC at run time: its
// SDPA engines live in libcudnn_engines_runtime_compiled and compile their kernels when a plan is
// built, through libnvrtc.so.<CUDA major> that libcudnn_graph opens and resolves on its own handle
// (dlopen/dlsym), found through the loader path (the nvidia-cuda-nvrtc wheel's lib folder).
extern "C" {
#define MFSDP_NO_NVRTC __attribute__((visibility("hidden"))) nvrtcResult
MFSDP_NO_NVRTC nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                  const char* const*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MFSDP_NO_NVRTC nvrtcDestroyProgram(nvrtcProgram*) { return NVRTC_ERROR_INTERNAL_ERROR; }
MFSDP_NO_NVRTC nvrtcCompileProgram(nvrtcProgram, int, const char* const*) { return NVRTC_ERROR_INTERNAL_ERROR; }
MFSDP_NO_NVRTC nvrtcGetProgramLogSize(nvrtcProgram, size_t*) { return NVRTC_ERROR_INTERNAL_ERROR; }
MFSDP_NO_NVRTC nvrtcGetProgramLog(nvrtcProgram, char*) { return NVRTC_ERROR_INTERNAL_ERROR; }
MFSDP_NO_NVRTC nvrtcGetCUBINSize(nvrtcProgram, size_t*) { return NVRTC_ERROR_INTERNAL_ERROR; }
MFSDP_NO_NVRTC nvrtcGetCUBIN(nvrtcProgram, char*) { return NVRTC_ERROR_INTERNAL_ERROR; }
#undef MFSDP_NO_NVRTC
}

namespace mfsdp::cuda_cudnn {
namespace {

namespace fe = cudnn_frontend;
using Uid = fe::graph::Tensor_attributes::uid_t;
enum : Uid { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string describe(const Dims& a) {
  return "B=" + std::to_string(a.B) + " T=" + std::to_string(a.T) + " H=" + std::to_string(a.H) +
         " Hkv=" + std::to_string(a.Hkv) + " d=" + std::to_string(a.d);
}

// The loaded cuDNN's version and the one of the headers this library was compiled against
// (major*10000 + minor*100 + patch), e.g. "cuDNN 92600, built against 91900".
std::string versions() {
  return "cuDNN " + std::to_string(cudnnGetVersion()) + ", built against " + std::to_string(CUDNN_VERSION);
}

// Throws std::runtime_error naming the op, the step, the shape and the cuDNN versions when a
// frontend call failed.
void check(fe::error_t status, const char* op, const char* step, const Dims& a) {
  if (status.is_good()) return;
  throw std::runtime_error(std::string("[") + op + "] cuDNN " + step + " failed (" + describe(a) + "; " +
                           versions() + "): " + status.get_message());
}

void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string("[cudnn_attention] ") + what + " failed: " + cudnnGetErrorString(s));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("[cudnn_attention] ") + what + " failed: " + cudaGetErrorString(e));
}

void check_dims(const Dims& a, const char* op) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string("[") + op + "] " + what + " (" + describe(a) + ")");
  };
  if (!head_dim_supported(a.d)) fail("head size " + std::to_string(a.d) + " not supported: cuDNN attention takes 64 or 128");
  if (a.B <= 0 || a.T <= 0 || a.H <= 0 || a.Hkv <= 0) fail("sizes must be positive");
  if (a.H % a.Hkv != 0) fail("Hkv must divide H");
  if (a.B > INT32_MAX / a.H || a.T > INT32_MAX / (a.H * a.d)) fail("sizes outside cuDNN's 32-bit range");
}

// Gives `t` dims [B, heads, T, d] with the strides of a [B, T, heads, d] buffer.
fe::graph::Tensor_attributes& bthd_layout(fe::graph::Tensor_attributes& t, Uid uid, const Dims& a, int64_t heads) {
  return t.set_uid(uid).set_dim({a.B, heads, a.T, a.d}).set_stride({a.T * heads * a.d, a.d, heads * a.d, 1});
}
std::shared_ptr<fe::graph::Tensor_attributes> bthd(fe::graph::Graph& g, const char* name, Uid uid, const Dims& a,
                                                    int64_t heads) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  return g.tensor(bthd_layout(t, uid, a, heads));
}
void as_bthd_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const Dims& a, int64_t heads) {
  bthd_layout(t->set_output(true), uid, a, heads);
}
std::vector<int64_t> stats_dim(const Dims& a) { return {a.B, a.H, a.T, 1}; }
std::vector<int64_t> stats_stride(const Dims& a) { return {a.H * a.T, a.T, 1, 1}; }

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const Dims& a) {
  auto g = new_graph();
  auto q = bthd(*g, "Q", kQ, a, a.H), k = bthd(*g, "K", kK, a, a.Hkv), v = bthd(*g, "V", kV, a, a.Hkv);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("causal_gqa")
                     .set_generate_stats(true)
                     .set_attn_scale(1.0f / std::sqrt(static_cast<float>(a.d)))
                     .set_causal_mask(true);
  auto [o, stats] = g->sdpa(q, k, v, options);
  as_bthd_output(o, kO, a, a.H);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim(a)).set_stride(
      stats_stride(a));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Dims& a) {
  auto g = new_graph();
  auto q = bthd(*g, "Q", kQ, a, a.H), k = bthd(*g, "K", kK, a, a.Hkv), v = bthd(*g, "V", kV, a, a.Hkv);
  auto o = bthd(*g, "O", kO, a, a.H), dout = bthd(*g, "dO", kDO, a, a.H);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("Stats")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(stats_dim(a))
                             .set_stride(stats_stride(a)));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("causal_gqa_backward")
                     .set_attn_scale(1.0f / std::sqrt(static_cast<float>(a.d)))
                     .set_causal_mask(true)
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  as_bthd_output(dq, kDQ, a, a.H);
  as_bthd_output(dk, kDK, a, a.Hkv);
  as_bthd_output(dv, kDV, a, a.Hkv);
  return g;
}

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

// The process's cuDNN state: the handle, the plans by shape and the workspace.
class Context {
 public:
  // Runs `pack` (uid -> device pointer) on the plan of `a` (built on first use) and the workspace.
  void execute(bool backward, const Dims& a, std::unordered_map<Uid, void*>& pack, void* stream, const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    cudnnHandle_t h = handle(static_cast<cudaStream_t>(stream));
    Plan& plan = plan_for(backward, a, h, op);
    check(plan.graph->execute(h, pack, workspace(plan.workspace)), op, "execute", a);
  }

 private:
  cudnnHandle_t handle(cudaStream_t stream) {
    if (!handle_) check_cudnn(cudnnCreate(&handle_), "cudnnCreate");
    if (!stream_bound_ || stream != stream_) {
      check_cudnn(cudnnSetStream(handle_, stream), "cudnnSetStream");
      stream_ = stream;
      stream_bound_ = true;
    }
    return handle_;
  }

  Plan& plan_for(bool backward, const Dims& a, cudnnHandle_t h, const char* op) {
    const auto key = std::make_tuple(backward, a.B, a.T, a.H, a.Hkv, a.d);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan p;
    p.graph = backward ? backward_graph(a) : forward_graph(a);
    check(p.graph->validate(), op, "graph validation", a);
    check(p.graph->build_operation_graph(h), op, "operation graph build", a);
    check(p.graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), op,
          "execution plan query", a);
    check(p.graph->check_support(), op, "support check", a);
    check(p.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), op, "plan build", a);
    check(p.graph->get_workspace_size(p.workspace), op, "workspace size query", a);
    return plans_.emplace(key, std::move(p)).first->second;
  }

  void* workspace(int64_t bytes) {
    if (bytes <= ws_bytes_) return ws_;
    if (ws_) check_cuda(cudaFree(ws_), "cudaFree of the workspace");  // waits for the work that used it
    ws_ = nullptr;
    ws_bytes_ = 0;
    check_cuda(cudaMalloc(&ws_, static_cast<size_t>(bytes)), ("cudaMalloc of a " + std::to_string(bytes) +
                                                              "-byte workspace").c_str());
    ws_bytes_ = bytes;
    return ws_;
  }

  std::mutex mu_;
  cudnnHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool stream_bound_ = false;
  std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
  void* ws_ = nullptr;
  int64_t ws_bytes_ = 0;
};

Context& context() {
  static Context* c = new Context;  // never destroyed: cuDNN objects outlive static destruction order
  return *c;
}

}  // namespace

bool built() { return true; }

void forward(const void* q, const void* k, const void* v, void* o, float* stats, const Dims& a, void* stream) {
  const char* op = "cudnn_attention_forward";
  check_dims(a, op);
  std::unordered_map<Uid, void*> pack = {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                         {kV, const_cast<void*>(v)}, {kO, o}, {kStats, stats}};
  context().execute(false, a, pack, stream, op);
}

void backward(const void* q, const void* k, const void* v, const void* o, const void* dout, const float* stats,
              void* dq, void* dk, void* dv, const Dims& a, void* stream) {
  const char* op = "cudnn_attention_backward";
  check_dims(a, op);
  std::unordered_map<Uid, void*> pack = {
      {kQ, const_cast<void*>(q)},    {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(o)},    {kDO, const_cast<void*>(dout)},
      {kStats, const_cast<float*>(stats)}, {kDQ, dq}, {kDK, dk}, {kDV, dv}};
  context().execute(true, a, pack, stream, op);
}

}  // namespace mfsdp::cuda_cudnn
