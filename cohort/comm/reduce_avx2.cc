// Reduction kernels built for the avx2 instruction set (see reduce_kernels.inc).
#define COHORT_KERNEL_NS avx2
#include "cohort/comm/reduce_kernels.inc"
