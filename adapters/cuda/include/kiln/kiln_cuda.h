/* SPDX-License-Identifier: MIT */
/*
 * kiln_cuda: the optional CUDA adapter (adapters/cuda/). Built and installed only where CMake
 * finds the CUDA toolkit; link kiln::kiln_cuda (find_package(kiln COMPONENTS cuda)). A static
 * library over the public kiln API only; it needs the CUDA runtime (libcudart).
 */
#ifndef KILN_KILN_CUDA_H
#define KILN_KILN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Fill *hooks with pin hooks for kiln_tensor_pin() that register each pinned range with
 * cudaHostRegister(cudaHostRegisterReadOnly) (mapped file pages are read only), and unregister
 * it on unpin. A registration failure fails the pin with IO, sys_errno 0, and a message that
 * ends in cudaGetErrorString()'s text and the cudaError_t value: "the pin hook failed for tensor
 * N: cudaHostRegister(read-only) failed: <CUDA error> (<code>)".
 */
KILN_API void kiln_cuda_pin_hooks(kiln_pin_hooks *hooks);

typedef struct kiln_cuda_load_options {
	uint32_t size;          /* 0 or sizeof(kiln_cuda_load_options) */
	uint32_t flags;         /* KILN_STREAM_DIRECT to read with O_DIRECT */
	uint32_t staging_count; /* pinned staging buffers; 0 means 4 */
	uint32_t engine;        /* enum kiln_stream_engine for the reads; 0 (AUTO): io_uring */
	size_t staging_size;    /* bytes per staging buffer; 0: 2 MiB, or 8 MiB with DIRECT */
	void *stream;           /* a cudaStream_t to copy on; NULL: kiln creates one */
	uint64_t reserved[4];
} kiln_cuda_load_options;

/*
 * Copy the payloads of `count` tensors (model indices; NULL: all) into device memory:
 * device_dests[i] must hold tensors[i]'s byte_length bytes (cudaMalloc'd by the caller). The
 * model's files are read with kiln_stream() into a ring of pinned staging buffers (cudaHostAlloc);
 * each landed chunk is copied with cudaMemcpyAsync and an event, and a buffer is refilled only
 * after its event, so the copy of one chunk overlaps the read of the next. Returns when every copy
 * has completed.
 *
 * Returns 0; UNSUPPORTED when there is no usable CUDA device (the message has the CUDA error);
 * IO when a CUDA call fails (the message names it); or what kiln_stream() returns.
 */
KILN_API int kiln_cuda_load(kiln_model *model, const uint64_t *tensors, size_t count,
			    void *const *device_dests, const kiln_cuda_load_options *opts,
			    kiln_stream_result *result, kiln_error *err);

/*
 * Every visible GPU as a kiln_load device (kiln_device): arenas with cudaMalloc, pinned
 * staging with cudaHostAlloc, each staging buffer's copies on a stream of its own per GPU
 * (cudaMemcpyAsync, waited for with cudaStreamSynchronize), so as many copies are in flight as
 * there are buffers, overlapped with the reads. Devices are numbered as the CUDA runtime numbers
 * them (CUDA_VISIBLE_DEVICES applies); kiln_load_options.place chooses each tensor's.
 *
 *   kiln_cuda_devices *gpus;
 *   kiln_cuda_devices_open(0, &gpus, &err);
 *   kiln_load_options lo = {.size = sizeof(lo), .device = kiln_cuda_device(gpus)};
 *   kiln_load(model, NULL, 0, &lo, ptrs, &arena, &res, &err);  (ptrs: device pointers)
 *   ... kiln_arena_free(arena) before kiln_cuda_devices_close(gpus) ...
 *
 * lanes: streams per GPU (0: 1024, kiln_load's most staging buffers). Returns 0, UNSUPPORTED
 * when no GPU is usable (the message has the CUDA error), NOMEM.
 */
typedef struct kiln_cuda_devices kiln_cuda_devices;
KILN_API int kiln_cuda_devices_open(uint32_t lanes, kiln_cuda_devices **out, kiln_error *err);
KILN_API const kiln_device *kiln_cuda_device(const kiln_cuda_devices *gpus);
/* Destroy the streams (after every kiln_load using them has returned). NULL is accepted. */
KILN_API void kiln_cuda_devices_close(kiln_cuda_devices *gpus);

#ifdef __cplusplus
}
#endif

#endif
