// Reduction kernels built for the generic instruction set (see reduce_kernels.inc).
#define COHORT_KERNEL_NS generic
#include "cohort/comm/reduce_kernels.inc"
