// Umbrella header of the optim module: Muon, AdamW, LR schedules, clipping (the CUDA kernels on raw
// device pointers: optim/optim_cuda.h, for sources built with CUDA only).
#pragma once
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"
#include "optim/schedule.h"
