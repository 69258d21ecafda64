// StreamCopy: memcpy with non-temporal stores for destinations that will not be read again
// soon (the output of a large collective). Skips the read-for-ownership of the destination
// lines, so a copy costs one read and one write of DRAM instead of two reads and a write.
// Falls back to memcpy without AVX2 or for small copies. Thread-safety: pure function.
#pragma once

#include <cstddef>

namespace cohort::comm {

void StreamCopy(void* dst, const void* src, size_t bytes);
// Orders preceding non-temporal stores before later stores (call before publishing).
void StreamFence();

}  // namespace cohort::comm
