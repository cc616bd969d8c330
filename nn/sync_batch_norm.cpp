// SyncBatchNorm2d and convert_sync_batchnorm (see nn/sync_batch_norm.h).
#include "nn/sync_batch_norm.h"

#include "tensor/error.h"

namespace reel::nn {

SyncBatchNorm2d::SyncBatchNorm2d(int64_t channels, std::shared_ptr<dist::Communicator> comm, double eps,
                                 double momentum)
    : BatchNorm2d("SyncBatchNorm2d", channels, eps, momentum) {
  REEL_CHECK(comm != nullptr, "SyncBatchNorm2d: no communicator");
  set_communicator(std::move(comm));
}

int64_t convert_sync_batchnorm(Module& model, std::shared_ptr<dist::Communicator> comm) {
  REEL_CHECK(comm != nullptr, "convert_sync_batchnorm: no communicator");
  int64_t converted = 0;
  auto convert = [&](Module& m) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
      bn->set_communicator(comm);
      ++converted;
    }
  };
  convert(model);
  for (const auto& [name, child] : model.named_modules()) convert(*child);
  return converted;
}

}  // namespace reel::nn
