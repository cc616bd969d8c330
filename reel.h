// reel — the one header a user includes.
#pragma once
#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "tensor/tensor.h"
