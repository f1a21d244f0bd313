/* Files for benchmarks: generated on demand, removed at exit. */
#ifndef KILN_BENCH_UTIL_H
#define KILN_BENCH_UTIL_H

#include <stdint.h>

/*
 * A file of `count` u8 tensors, named "blk.N.w" when `named` (the u16 heap offsets of the
 * format allow only a few thousand such names), sharing `payload` bytes of payload. When
 * `sparse_total` is nonzero the last tensor is grown so the payload region is that many bytes,
 * as a hole (ftruncate), costing no disk. Returns a malloc'd path; exits on failure.
 */
char *kbu_tensors_file(uint32_t count, uint64_t payload, uint64_t sparse_total, int named);

#endif
