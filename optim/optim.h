// optim/ — everything a training loop needs after backward: SGD and AdamW with the accumulation
// contract (optimizer.h; the micro-batch split of a step in accumulation.h), LR schedules
// (schedule.h), clipping by global norm (clip.h), the fp16 GradScaler (grad_scaler.h), and the
// mixed-precision policy (autograd/autocast.h, below nn since its layers consult it; included here
// so that a training loop's one include still brings it).
#pragma once
#include "autograd/autocast.h"
#include "optim/accumulation.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "optim/train_step.h"
