// optim/ — everything a training loop needs after backward: SGD and AdamW with the accumulation
// contract (optimizer.h), LR schedules (schedule.h), clipping by global norm (clip.h), the fp16
// GradScaler (grad_scaler.h) and the mixed-precision policy (precision.h).
#pragma once
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/precision.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "optim/train_step.h"
