// split_accumulation (see optim/accumulation.h).
#include "optim/accumulation.h"

#include "tensor/error.h"

namespace reel::optim {

AccumulationSplit split_accumulation(int64_t effective_batch, int64_t micro_batch) {
  REEL_CHECK(effective_batch > 0, "split_accumulation: the effective batch must be positive, got ", effective_batch);
  REEL_CHECK(micro_batch > 0, "split_accumulation: the micro-batch must be positive, got ", micro_batch);
  REEL_CHECK(micro_batch <= effective_batch, "split_accumulation: micro-batch ", micro_batch,
             " is larger than the effective batch ", effective_batch);
  AccumulationSplit s;
  s.micro_batch = micro_batch;
  s.accum = effective_batch / micro_batch + (effective_batch % micro_batch != 0 ? 1 : 0);
  // m (accum - 1) < N, so neither the product nor the difference overflows.
  s.last_micro_batch = effective_batch - micro_batch * (s.accum - 1);
  return s;
}

}  // namespace reel::optim
