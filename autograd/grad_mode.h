// Grad mode: whether ops record backward nodes. Off inside backward itself and under NoGradGuard
// (optimizer updates, evaluation). Thread-local, like PyTorch's.
#pragma once

namespace reel {

bool grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace reel
