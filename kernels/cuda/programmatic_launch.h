// The switch of programmatic dependent launch (kernels/cuda/launch.cuh explains it), host code only:
// the fused-elementwise kernels' launcher (kernels/jit/nvrtc.cpp) reads it as the .cu kernels do.
#pragma once

namespace reel::cuda {

// Whether kernels launched now on the current device ask for programmatic dependent launch: devices
// of compute capability 9.0 and later, unless turned off by set_programmatic_launch(false) or by the
// environment variable REEL_PROGRAMMATIC_LAUNCH=0 (read once; 0 or 1, any other value is an error).
// Either way a kernel computes the same values from the same inputs; a CUDA graph keeps what was
// asked when it was captured.
bool programmatic_launch();
// Sets the switch; returns it as it was (on by default). The device's support is not part of it.
bool set_programmatic_launch(bool on);

// Sets the switch for a scope and puts it back on any exit.
class ScopedProgrammaticLaunch {
 public:
  explicit ScopedProgrammaticLaunch(bool on) : previous_(set_programmatic_launch(on)) {}
  ~ScopedProgrammaticLaunch() { set_programmatic_launch(previous_); }
  ScopedProgrammaticLaunch(const ScopedProgrammaticLaunch&) = delete;
  ScopedProgrammaticLaunch& operator=(const ScopedProgrammaticLaunch&) = delete;

 private:
  bool previous_;
};

}  // namespace reel::cuda
