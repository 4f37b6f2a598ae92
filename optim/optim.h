// Umbrella header of the optim module: Muon, AdamW, LR schedules, clipping (and CUDA variants).
#pragma once
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/exact_sum.h"
#include "optim/muon.h"
#include "optim/schedule.h"
#if defined(MFSDP_WITH_CUDA) && MFSDP_WITH_CUDA
#include "optim/optim_cuda.h"
#endif
