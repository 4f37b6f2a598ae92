// A build without CUDA: the GPU calibration refuses with the reason (apps/bench/calibrate_cuda.h).
#include <stdexcept>

#include "apps/bench/calibrate_cuda.h"

namespace mfsdp {

CudaCalibrationResult calibrate_cuda_device(const CudaCalibration&, const ClusterSpec&, const std::string&) {
  throw std::runtime_error(
      "--calibrate --device cuda: MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF or no nvcc at configure "
      "time); nothing was measured");
}

}  // namespace mfsdp
