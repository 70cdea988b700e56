/* Convenience include, as with the real toolkit. */
#ifndef RANKECHO_SIM_CUDA_RUNTIME_H
#define RANKECHO_SIM_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#endif
