/* SPDX-License-Identifier: MIT */
/*
 * kiln_cuda, the CUDA adapter: pin hooks that register host ranges read-only, and a loader that
 * streams tensors to device memory through pinned staging buffers, one event per buffer so reads
 * and copies overlap. Public kiln API only.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kiln/kiln_cuda.h"
#include "kiln/toolkit.h"

static int pin(void *ctx, void *ptr, size_t len, kiln_error *why)
{
	(void)ctx;
	cudaError_t e = cudaHostRegister(ptr, len, cudaHostRegisterReadOnly);
	if (e == cudaSuccess)
		return 0;
	/* A CUDA error is not an errno: sys_errno stays 0 and the text says what happened. */
	snprintf(why->message, sizeof(why->message), "cudaHostRegister(read-only) failed: %s (%d)",
		 cudaGetErrorString(e), (int)e);
	return 1;
}

static void unpin(void *ctx, void *ptr, size_t len)
{
	(void)ctx;
	(void)len;
	cudaHostUnregister(ptr);
}

void kiln_cuda_pin_hooks(kiln_pin_hooks *hooks)
{
	hooks->pin = pin;
	hooks->unpin = unpin;
	hooks->ctx = NULL;
}

struct load {
	cudaStream_t stream;
	cudaEvent_t *events;
	void *const *dests;   /* device destinations, by position in the tensor list */
	const size_t *pos_of; /* tensor index -> position, for the chunk callback */
	cudaError_t error;
	const char *call;
};

static int on_chunk(void *ctx, const kiln_chunk *c)
{
	struct load *l = ctx;
	char *dst = (char *)l->dests[l->pos_of[c->tensor]] + c->offset;
	cudaError_t e = cudaMemcpyAsync(dst, c->data, c->length, cudaMemcpyHostToDevice, l->stream);
	if (e == cudaSuccess)
		e = cudaEventRecord(l->events[c->buffer], l->stream);
	if (e != cudaSuccess) {
		l->error = e;
		l->call = "cudaMemcpyAsync";
		return 1;
	}
	return 0;
}

static int before_reuse(void *ctx, uint32_t buffer)
{
	struct load *l = ctx;
	cudaError_t e = cudaEventSynchronize(l->events[buffer]);
	if (e != cudaSuccess) {
		l->error = e;
		l->call = "cudaEventSynchronize";
		return 1;
	}
	return 0;
}

int kiln_cuda_load(kiln_model *model, const uint64_t *tensors, size_t count,
		   void *const *device_dests, const kiln_cuda_load_options *opts,
		   kiln_stream_result *result, kiln_error *err)
{
	kiln_cuda_load_options o = {0};
	if (opts)
		o = *opts;
	if (!model || !device_dests)
		return kiln_error_set(err, KILN_INVAL, 0, "model and device_dests are required");
	uint32_t nb = o.staging_count ? o.staging_count : 4;
	/* Measured on an H200 host (docs/benchmarks.md): from the page cache, 2 MiB buffers stay in
	 * the CPU's cache between the read and the DMA (8.4 GB/s against 7.4 with 8 MiB); O_DIRECT
	 * wants larger requests to keep the disk busy (2.3 GB/s with 8 MiB against 2.2 with 4). */
	size_t bs = o.staging_size ? o.staging_size
				   : (size_t)((o.flags & KILN_STREAM_DIRECT) ? 8 : 2) << 20;
	int devices = 0;
	cudaError_t e = cudaGetDeviceCount(&devices);
	if (e != cudaSuccess || devices == 0)
		return kiln_error_set(err, KILN_UNSUPPORTED, 0, "no CUDA device: %s",
				      e != cudaSuccess ? cudaGetErrorString(e) : "none found");

	uint64_t total = kiln_model_count(model);
	size_t n = tensors ? count : (size_t)total;
	size_t *pos_of = calloc(total ? (size_t)total : 1, sizeof(*pos_of));
	void **ring = calloc(nb, sizeof(*ring));
	cudaEvent_t *events = calloc(nb, sizeof(*events));
	struct load l = {
	    .stream = o.stream, .events = events, .dests = device_dests, .pos_of = pos_of};
	int rc = 0, own_stream = 0;
	uint32_t made = 0;
	if (!pos_of || !ring || !events) {
		rc = kiln_error_set(err, KILN_NOMEM, 0, "out of memory");
		goto out;
	}
	for (size_t k = 0; k < n; k++) {
		uint64_t i = tensors ? tensors[k] : k;
		if (i >= total) {
			rc = kiln_error_set(err, KILN_INVAL, 0,
					    "tensor index %llu is out of range (count %llu)",
					    (unsigned long long)i, (unsigned long long)total);
			goto out;
		}
		pos_of[i] = k;
	}
	if (!l.stream) {
		if ((e = cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking)) !=
		    cudaSuccess) {
			l.call = "cudaStreamCreate";
			goto cuda_fail;
		}
		own_stream = 1;
	}
	for (; made < nb; made++) {
		if ((e = cudaHostAlloc(&ring[made], bs, cudaHostAllocDefault)) != cudaSuccess) {
			l.call = "cudaHostAlloc";
			goto cuda_fail;
		}
		if ((e = cudaEventCreateWithFlags(&events[made], cudaEventDisableTiming)) !=
		    cudaSuccess) {
			cudaFreeHost(ring[made]);
			l.call = "cudaEventCreate";
			goto cuda_fail;
		}
	}
	kiln_stream_options so = {.size = sizeof(so),
				  .flags = o.flags,
				  .engine = o.engine,
				  .staging = ring,
				  .staging_count = nb,
				  .staging_size = bs,
				  .queue_depth = nb,
				  .on_chunk = on_chunk,
				  .before_reuse = before_reuse,
				  .ctx = &l};
	rc = kiln_stream(model, tensors, count, NULL, &so, result, err);
	/* Every copy must be finished before the staging memory goes away. */
	e = cudaStreamSynchronize(l.stream);
	if (rc == KILN_CANCELED && l.error != cudaSuccess) {
		e = l.error;
		goto cuda_fail;
	}
	if (!rc && e != cudaSuccess) {
		l.call = "cudaStreamSynchronize";
		goto cuda_fail;
	}
	goto out;
cuda_fail:
	rc = kiln_error_set(err, KILN_IO, 0, "%s failed: %s", l.call, cudaGetErrorString(e));
out:
	for (uint32_t b = 0; b < made; b++) {
		cudaEventDestroy(events[b]);
		cudaFreeHost(ring[b]);
	}
	if (own_stream)
		cudaStreamDestroy(l.stream);
	free(ring);
	free(events);
	free(pos_of);
	return rc;
}

/* --- the device table of kiln_load --------------------------------------------------------- */

/* One stream per (device, lane), made on first use; a lane's copies and waits come from one
 * reader thread at a time, but lanes of different threads meet in the table. */
struct kiln_cuda_devices {
	int count;
	uint32_t lanes;
	cudaStream_t *streams; /* count * lanes, NULL until used */
	pthread_mutex_t lock;
	kiln_device dev;
};

static int cuda_fail(kiln_error *err, const char *call, int device, cudaError_t e)
{
	return kiln_error_set(err, e == cudaErrorMemoryAllocation ? KILN_NOMEM : KILN_IO, 0,
			      "cuda device %d: %s failed: %s (%d)", device, call,
			      cudaGetErrorString(e), (int)e);
}

/* Arenas are allocated and freed on the caller's thread: its current device is put back, so a
 * runtime's own "current GPU" is what it was. */
static int d_alloc(void *ctx, uint32_t device, size_t len, void **ptr, kiln_error *err)
{
	(void)ctx;
	int prev = -1;
	cudaGetDevice(&prev);
	cudaError_t e = cudaSetDevice((int)device);
	if (e == cudaSuccess)
		e = cudaMalloc(ptr, len ? len : 1);
	if (prev >= 0)
		cudaSetDevice(prev);
	return e == cudaSuccess ? 0 : cuda_fail(err, "cudaMalloc", (int)device, e);
}

static void d_release(void *ctx, uint32_t device, void *ptr)
{
	(void)ctx;
	int prev = -1;
	cudaGetDevice(&prev);
	cudaSetDevice((int)device);
	cudaFree(ptr);
	if (prev >= 0)
		cudaSetDevice(prev);
}

static int d_host_alloc(void *ctx, size_t len, void **ptr, kiln_error *err)
{
	(void)ctx;
	cudaError_t e = cudaHostAlloc(ptr, len, cudaHostAllocPortable);
	return e == cudaSuccess ? 0 : cuda_fail(err, "cudaHostAlloc", -1, e);
}

static void d_host_release(void *ctx, void *ptr)
{
	(void)ctx;
	cudaFreeHost(ptr);
}

/* KILN_LOAD_REGISTER: file pages are mapped read only, and every GPU copies from them. */
static int d_host_register(void *ctx, const void *ptr, size_t len, kiln_error *err)
{
	(void)ctx;
	cudaError_t e =
	    cudaHostRegister((void *)ptr, len, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
	return e == cudaSuccess ? 0 : cuda_fail(err, "cudaHostRegister(read-only)", -1, e);
}

static void d_host_unregister(void *ctx, const void *ptr)
{
	(void)ctx;
	cudaHostUnregister((void *)ptr);
}

static cudaStream_t *lane_stream(struct kiln_cuda_devices *d, uint32_t device, uint32_t lane,
				 kiln_error *err)
{
	if ((int)device >= d->count || lane >= d->lanes) {
		kiln_error_set(err, KILN_INVAL, 0, "cuda: device %u lane %u out of range", device,
			       lane);
		return NULL;
	}
	cudaStream_t *s = &d->streams[device * d->lanes + lane];
	pthread_mutex_lock(&d->lock);
	cudaError_t e = cudaSuccess;
	if (!*s && (e = cudaSetDevice((int)device)) == cudaSuccess)
		e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
	pthread_mutex_unlock(&d->lock);
	if (e != cudaSuccess) {
		cuda_fail(err, "cudaStreamCreate", (int)device, e);
		return NULL;
	}
	return s;
}

static int d_copy(void *ctx, uint32_t device, uint32_t lane, void *dst, const void *src, size_t len,
		  kiln_error *err)
{
	struct kiln_cuda_devices *d = ctx;
	cudaStream_t *s = lane_stream(d, device, lane, err);
	if (!s)
		return err ? err->code : KILN_IO;
	cudaError_t e = cudaSetDevice((int)device);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, *s);
	return e == cudaSuccess ? 0 : cuda_fail(err, "cudaMemcpyAsync", (int)device, e);
}

static int d_wait(void *ctx, uint32_t device, uint32_t lane, kiln_error *err)
{
	struct kiln_cuda_devices *d = ctx;
	cudaStream_t *s = lane_stream(d, device, lane, err);
	if (!s)
		return err ? err->code : KILN_IO;
	cudaError_t e = cudaStreamSynchronize(*s);
	return e == cudaSuccess ? 0 : cuda_fail(err, "cudaStreamSynchronize", (int)device, e);
}

int kiln_cuda_devices_open(uint32_t lanes, kiln_cuda_devices **out, kiln_error *err)
{
	*out = NULL;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n <= 0)
		return kiln_error_set(err, KILN_UNSUPPORTED, 0, "no usable CUDA device: %s (%d)",
				      e == cudaSuccess ? "none visible" : cudaGetErrorString(e),
				      (int)e);
	if (!lanes)
		lanes = 1024; /* 16 threads x 64 buffers, kiln_load's most */
	struct kiln_cuda_devices *d = calloc(1, sizeof(*d));
	if (d)
		d->streams = calloc((size_t)n * lanes, sizeof(*d->streams));
	if (!d || !d->streams) {
		free(d);
		return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
	}
	d->count = n;
	d->lanes = lanes;
	pthread_mutex_init(&d->lock, NULL);
	d->dev = (kiln_device){.size = sizeof(kiln_device),
			       .count = (uint32_t)n,
			       .name = "cuda",
			       .ctx = d,
			       .alloc = d_alloc,
			       .release = d_release,
			       .host_alloc = d_host_alloc,
			       .host_release = d_host_release,
			       .copy = d_copy,
			       .wait = d_wait,
			       .host_register = d_host_register,
			       .host_unregister = d_host_unregister};
	*out = d;
	return 0;
}

const kiln_device *kiln_cuda_device(const kiln_cuda_devices *d)
{
	return d ? &d->dev : NULL;
}

void kiln_cuda_devices_close(kiln_cuda_devices *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < (size_t)d->count * d->lanes; i++)
		if (d->streams[i]) {
			cudaSetDevice((int)(i / d->lanes));
			cudaStreamDestroy(d->streams[i]);
		}
	pthread_mutex_destroy(&d->lock);
	free(d->streams);
	free(d);
}
