// The nn layer in one include: Module, layers, init, state_dict and safetensors files and the
// benchmark models.
#pragma once
#include "nn/attention.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/module.h"
#include "nn/norm_layers.h"
#include "nn/safetensors.h"
#include "nn/state_dict.h"
#include "nn/sync_batch_norm.h"
#include "nn/workloads.h"
