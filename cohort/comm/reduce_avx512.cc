// Reduction kernels built for the avx512 instruction set (see reduce_kernels.inc).
#define COHORT_KERNEL_NS avx512
#include "cohort/comm/reduce_kernels.inc"
