/* SPDX-License-Identifier: MIT */
/* Files and memory for benchmarks; files are removed at exit. The clock and page-cache control
 * (residency, eviction, warming) are in measure/measure.h, shared with `klnt bench`. */
#ifndef KILN_BENCH_UTIL_H
#define KILN_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "shim.h"

/*
 * A file of `count` u8 tensors, named "blk.N.w" when `named` (the u16 heap offsets of the
 * format allow only a few thousand such names), sharing `payload` bytes of payload. When
 * `sparse_total` is nonzero the last tensor is grown so the payload region is that many bytes,
 * as a hole (ftruncate), costing no disk. Returns a malloc'd path; exits on failure.
 */
char *kbu_tensors_file(uint32_t count, uint64_t payload, uint64_t sparse_total, int named);

/*
 * Stock files for the open benchmarks, written directly (no kiln writer), shaped like the
 * checkpoints of the tools that make them: a safetensors file of `count` tensors named like a
 * Hugging Face transformer's ("model.layers.L.self_attn.q_proj.weight", ...), F16/BF16/F32 with
 * small 2-D or 1-D shapes, in name order in the header as the reference writer sorts them; and
 * a GGUF v3 file of `count` tensors named like llama.cpp's ("blk.L.attn_q.weight", F16/F32/
 * Q4_K/Q8_0) with a tokenizer vocabulary of about `vocab_bytes` bytes of strings (and their
 * scores and types, as llama.cpp writes them) among its key/values, `count` 0 for a
 * metadata-only file. Payload bytes are zero. Returns a malloc'd path, removed at exit.
 */
char *kbu_safetensors_file(uint32_t count);
char *kbu_gguf_file(uint32_t count, uint64_t vocab_bytes);

/*
 * A file of `count` named u8 tensors ("blk.N.w") of varied sizes (every fifth one small, like a
 * norm vector; the others within +-25% of each other), the block at most `block_max` bytes and
 * within a few KiB of it. Payload byte k of tensor t is kbu_byte(seed, t, k): pseudo-random and
 * never zero, so no file system or memory path can shortcut zero pages. Written with fsync.
 * Returns a malloc'd path, removed at exit; exits on failure.
 */
char *kbu_random_file(uint32_t count, uint64_t block_max, uint64_t seed);
/* The same tensors written as a safetensors file when `safetensors` (its header orders them by
 * name, so a tensor's generator index is the N of its name, not its index in the file). */
char *kbu_random_file_as(uint32_t count, uint64_t block_max, uint64_t seed, int safetensors);
/* The payload generator of kbu_random_file(): bytes [offset, offset + len) of tensor `tensor`. */
void kbu_fill(uint64_t seed, uint32_t tensor, uint64_t offset, void *buf, size_t len);
uint8_t kbu_byte(uint64_t seed, uint32_t tensor, uint64_t offset);

/*
 * `len` bytes of anonymous memory at a 2 MiB boundary, with MADV_HUGEPAGE when `huge`, and every
 * page written (first touch paid here) when `touch`. Exits on failure. Free with kbu_unmap().
 */
void *kbu_map(size_t len, int huge, int touch);
void kbu_unmap(void *p, size_t len);

/*
 * Make the file cold (evicted, at most `resident_max` pages left, checked with mincore) or warm
 * (every page resident), with the timer paused. Returns 0, or skips the benchmark and returns
 * -1. Leaves the timer running.
 */
int kbu_set_temperature(kb_state *st, const char *path, int cold, long resident_max);

#endif
