// Timing candidate kernels on the device (device_timing.h).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_timing.h"

namespace reel::cuda {
namespace {

constexpr int kSpinMicroseconds = 100;  // enough for the host to enqueue the timed runs

struct Event {
  cudaEvent_t e = nullptr;
  Event() { REEL_CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }  // status ignored: nothing useful can be done about it here
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Keeps the stream busy for about `us` microseconds.
__global__ void spin_kernel(int us) {
  grid_dependency_wait();
  for (int i = 0; i < us; ++i) __nanosleep(1000);
}

}  // namespace

bool capturing(Device device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REEL_CUDA_CHECK(cudaStreamIsCapturing(stream_of(device), &status));
  return status != cudaStreamCaptureStatusNone;
}

std::optional<float> mean_device_ms(Device device, int runs, const std::function<bool()>& run) {
  const cudaStream_t s = stream_of(device);
  Event start, stop;
  if (!run()) return std::nullopt;
  launch_kernel(spin_kernel, 1, 1, 0, s, kSpinMicroseconds);
  REEL_CUDA_LAUNCH_CHECK();
  REEL_CUDA_CHECK(cudaEventRecord(start.e, s));
  for (int i = 0; i < runs; ++i)
    if (!run()) return std::nullopt;
  REEL_CUDA_CHECK(cudaEventRecord(stop.e, s));
  REEL_CUDA_CHECK(cudaEventSynchronize(stop.e));
  float ms = 0;
  REEL_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
  return ms / runs;
}

}  // namespace reel::cuda
