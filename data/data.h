// reel's data layer in one include: Fashion-MNIST/idx readers (fashion_mnist.h), byte-level text
// (text.h) and the shuffling batcher (loader.h). Everything lives in namespace reel::data.
#pragma once
#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "data/text.h"
#include "data/text_lines.h"
