/* SPDX-License-Identifier: MIT */
/* The CUDA adapter (adapters/cuda/). Built only with the CUDA toolkit; the device tests skip,
 * saying why, where no CUDA device is usable, and the no-device tests skip where one is. */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "kiln/kiln_cuda.h"

static void need_device(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0)
		cr_skip_test("no CUDA device here (%s): the adapter is built but not exercised",
			     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
}

static char *model(uint64_t **sizes_out, uint8_t ***data_out)
{
	enum { N = 4 };
	static uint64_t sizes[N] = {5, 3u << 20, 0, 100000};
	static uint8_t *data[N];
	kiln_tensor_spec t[N];
	for (int i = 0; i < N; i++) {
		data[i] = malloc(sizes[i] + 1);
		for (uint64_t k = 0; k < sizes[i]; k++)
			data[i][k] = (uint8_t)(k * 31 + (uint64_t)i);
		t[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizes[i]}, .data = data[i]};
	}
	blob b = build(t, N);
	char *p = write_temp(b.p, b.len);
	blob_free(&b);
	*sizes_out = sizes;
	*data_out = data;
	return p;
}

Test(cuda, no_device_is_unsupported_not_a_crash)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
		cr_skip_test("a CUDA device is present; this test is for machines without one");
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	kiln_model *dir;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, NULL), 0);
	void *dests[4] = {0};
	kiln_error err;
	cr_assert_eq(kiln_cuda_load(dir, NULL, 0, dests, NULL, NULL, &err), KILN_UNSUPPORTED);
	cr_assert_not_null(strstr(err.message, "no CUDA device"), "%s", err.message);
	kiln_model_close(dir);
	unlink(p);
	free(p);
}

Test(cuda, pin_hook_failure_carries_the_cuda_error_text)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaSuccess && n > 0)
		cr_skip_test("a CUDA device is present; this test is for machines without one");
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	kiln_model *dir;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, NULL), 0);
	kiln_pin_hooks h;
	kiln_cuda_pin_hooks(&h);
	kiln_error err;
	int rc = kiln_tensor_pin(dir, 1, &h, &err);
	if (rc == KILN_IO && err.sys_errno != 0)
		cr_skip_test("mlock refused here (%s); the hook was not reached", err.message);
	cr_assert_eq(rc, KILN_IO, "%s", err.message);
	cr_assert_eq(err.sys_errno, 0, "a CUDA error is not an errno");
	cr_assert_eq(err.tensor, 1);
	/* The runtime's own words, not a number: the same text cudaGetDeviceCount gave. */
	char want[200];
	snprintf(want, sizeof(want),
		 "the pin hook failed for tensor 1: cudaHostRegister(read-only) failed: %s",
		 cudaGetErrorString(e != cudaSuccess ? e : cudaErrorNoDevice));
	cr_assert_not_null(strstr(err.message, want), "%s\nwanted: %s", err.message, want);
	cr_assert_eq(kiln_model_try_close(dir, &err), 0, "the failed pin left nothing pinned");
	unlink(p);
	free(p);
}

Test(cuda, load_to_device_matches_the_file)
{
	need_device();
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	for (unsigned src = 0; src <= KILN_SOURCE_URING; src++) {
		if (src == KILN_SOURCE_BUFFER)
			continue;
		kiln_open_options o = {.source = src};
		kiln_model *dir;
		cr_assert_eq(kiln_model_open(p, &o, &dir, NULL), 0);
		void *dev[4];
		for (int i = 0; i < 4; i++)
			cr_assert_eq(cudaMalloc(&dev[i], sizes[i] + 1), cudaSuccess);
		kiln_cuda_load_options lo = {.staging_count = 3, .staging_size = 256 * 1024};
		kiln_stream_result res;
		kiln_error err;
		cr_assert_eq(kiln_cuda_load(dir, NULL, 0, dev, &lo, &res, &err), 0, "%s",
			     err.message);
		cr_assert_gt(res.chunks, 12);
		for (int i = 0; i < 4; i++) {
			uint8_t *back = malloc(sizes[i] + 1);
			cr_assert_eq(cudaMemcpy(back, dev[i], sizes[i], cudaMemcpyDeviceToHost),
				     cudaSuccess);
			cr_assert_eq(memcmp(back, data[i], sizes[i]), 0, "tensor %d via %s", i,
				     kiln_source_name(src));
			free(back);
			cudaFree(dev[i]);
		}
		kiln_model_close(dir);
	}
	unlink(p);
	free(p);
}

Test(cuda, pin_hooks_register_read_only)
{
	need_device();
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	kiln_model *dir;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, NULL), 0);
	kiln_pin_hooks h;
	kiln_cuda_pin_hooks(&h);
	kiln_error err;
	cr_assert_eq(kiln_tensor_pin(dir, 1, &h, &err), 0, "%s", err.message);
	const kiln_tensor *t = kiln_model_tensor(dir, 1);
	/* A registered host range can be the source of a device copy. */
	void *dev;
	cr_assert_eq(cudaMalloc(&dev, t->byte_length), cudaSuccess);
	cr_assert_eq(cudaMemcpy(dev, t->data, t->byte_length, cudaMemcpyHostToDevice), cudaSuccess);
	uint8_t *back = malloc(t->byte_length);
	cr_assert_eq(cudaMemcpy(back, dev, t->byte_length, cudaMemcpyDeviceToHost), cudaSuccess);
	cr_assert_eq(memcmp(back, data[1], t->byte_length), 0);
	free(back);
	cudaFree(dev);
	cr_assert_eq(kiln_tensor_unpin(dir, 1, &err), 0);
	cr_assert_eq(kiln_model_try_close(dir, &err), 0);
	unlink(p);
	free(p);
}

Test(cuda, no_device_pipeline_is_unsupported)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
		cr_skip_test("a CUDA device is present; this test is for machines without one");
	kiln_cuda_devices *g = (kiln_cuda_devices *)&n;
	kiln_error err;
	cr_assert_eq(kiln_cuda_devices_open(0, &g, &err), KILN_UNSUPPORTED);
	cr_assert_null(g);
	cr_assert_not_null(strstr(err.message, "no usable CUDA device"), "%s", err.message);
	cr_assert_null(kiln_cuda_device(NULL));
	kiln_cuda_devices_close(NULL);
}

/* The pipeline onto every GPU, tensors spread over them, each thread count: the bytes copied
 * back are the file's, and the pinned staging stays within its budget. */
static uint32_t spread(void *ctx, const kiln_tensor *t)
{
	return (uint32_t)(t->index % *(const uint32_t *)ctx);
}

Test(cuda, pipeline_to_every_gpu_matches_the_file)
{
	need_device();
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p, NULL, &m, &err), 0);
	kiln_cuda_devices *g;
	cr_assert_eq(kiln_cuda_devices_open(0, &g, &err), 0, "%s", err.message);
	uint32_t ngpu = kiln_cuda_device(g)->count;
	/* Through staging, then with the mapping's pages registered (KILN_LOAD_REGISTER). */
	for (uint32_t run = 0; run < 4; run++) {
		uint32_t threads = run % 2 ? 4 : 1;
		kiln_load_options o = {.size = sizeof(o),
				       .flags = run >= 2 ? KILN_LOAD_REGISTER : 0,
				       .threads = threads,
				       .chunk_size = 256u << 10,
				       .pinned_bytes = 4u << 20,
				       .device = kiln_cuda_device(g),
				       .place = spread,
				       .ctx = &ngpu};
		void *ptrs[4];
		kiln_arena *a;
		kiln_load_result res;
		cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, &res, &err), 0, "%s", err.message);
		cr_assert_leq(res.pinned_bytes,
			      run < 2 && o.pinned_bytes < 2 * threads * o.chunk_size
				  ? 2 * threads * o.chunk_size
				  : o.pinned_bytes);
		for (int i = 0; i < 4; i++) {
			uint8_t *back = malloc(sizes[i] + 1);
			cudaSetDevice((int)(i % (int)ngpu));
			cr_assert_eq(cudaMemcpy(back, ptrs[i], sizes[i], cudaMemcpyDeviceToHost),
				     cudaSuccess);
			cr_assert_eq(memcmp(back, data[i], sizes[i]), 0, "tensor %d", i);
			free(back);
		}
		kiln_arena_free(a);
	}
	kiln_cuda_devices_close(g);
	kiln_model_close(m);
	unlink(p);
	free(p);
}

/* A model opened to check its digests, loaded onto the GPU by the pipeline: every chunk is
 * hashed as it lands in staging; a byte flipped in the file after the open fails the load with
 * CORRUPT naming the chunk, and no tensor is handed out. */
Test(cuda, pipeline_checks_every_chunk_on_its_way_to_the_gpu)
{
	need_device();
	uint64_t *sizes;
	uint8_t **data;
	char *p = model(&sizes, &data);
	kiln_tensor_spec t[4];
	for (int i = 0; i < 4; i++)
		t[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizes[i]}, .data = data[i]};
	kiln_error err;
	/* Written again by kiln's writer, which puts the digest table in. */
	cr_assert_eq(kiln_write_file(p, t, 4, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	kiln_cuda_devices *g;
	cr_assert_eq(kiln_cuda_devices_open(0, &g, &err), 0, "%s", err.message);
	kiln_open_options oo = {.size = sizeof(oo),
				.flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	for (int flipped = 0; flipped < 2; flipped++) {
		kiln_model *m;
		cr_assert_eq(kiln_model_open(p, &oo, &m, &err), 0, "%s", err.message);
		if (flipped) {
			FILE *f = fopen(p, "r+b");
			cr_assert_not_null(f);
			long at = (long)(kiln_model_tensor(m, 1)->file_offset + sizes[1] / 2);
			cr_assert_eq(fseek(f, at, SEEK_SET), 0);
			int c = fgetc(f);
			cr_assert_eq(fseek(f, at, SEEK_SET), 0);
			fputc(c ^ 1, f);
			fclose(f);
		}
		kiln_load_options o = {.size = sizeof(o),
				       .threads = 2,
				       .chunk_size = 256u << 10,
				       .pinned_bytes = 4u << 20,
				       .device = kiln_cuda_device(g)};
		void *ptrs[4];
		kiln_arena *a = (kiln_arena *)1;
		int rc = kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err);
		if (flipped) {
			cr_assert_eq(rc, KILN_CORRUPT, "%s: %s", kiln_code_name(rc), err.message);
			cr_assert_str_eq(err.field, "digests");
			cr_assert_not_null(strstr(err.message, "differs from its digest"), "%s",
					   err.message);
			cr_assert_null(a);
		} else {
			cr_assert_eq(rc, 0, "%s", err.message);
			for (int i = 0; i < 4; i++) {
				uint8_t *back = malloc(sizes[i] + 1);
				cr_assert_eq(
				    cudaMemcpy(back, ptrs[i], sizes[i], cudaMemcpyDeviceToHost),
				    cudaSuccess);
				cr_assert_eq(memcmp(back, data[i], sizes[i]), 0, "tensor %d", i);
				free(back);
			}
			kiln_arena_free(a);
		}
		kiln_model_close(m);
	}
	kiln_cuda_devices_close(g);
	unlink(p);
	free(p);
}
