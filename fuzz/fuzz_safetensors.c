/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are a safetensors file. Read it (kc_st_read, through a memfd); a
 * refusal must be a format class with one line naming the file. An accepted file must obey the
 * rules independently of how the reader checked them (the payloads tile the data region in
 * model order, each the size its shape and dtype say), and must survive kc_st_write and a second
 * read with the same tensors, the same payload bytes and the same metadata document.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "model.h"

/* bits per element of the dtypes the reader produces (opaque: the safetensors dtype's) */
static unsigned bits_of(const struct kc_tensor *t)
{
	if (!kiln_dtype_is_opaque(t->dtype))
		return kiln_dtype_bits(t->dtype);
	static const struct {
		const char *name;
		unsigned bits, block;
	} op[] = {{"F6_E2M3", 6, 3},
		  {"F6_E3M2", 6, 3},
		  {"C64", 64, 8},
		  {"F8_E4M3FNUZ", 8, 1},
		  {"F8_E5M2FNUZ", 8, 1}};
	for (size_t i = 0; i < sizeof(op) / sizeof(op[0]); i++)
		if (t->layout && strcmp(t->layout, op[i].name) == 0) {
			FUZZ_CHECK(t->block_size == op[i].block, "block of %s", t->layout);
			return op[i].bits;
		}
	FUZZ_CHECK(0, "opaque tensor %s with layout %s", t->name, t->layout ? t->layout : "-");
	return 0;
}

static void check_error(int rc, const kiln_error *err, const char *path)
{
	FUZZ_CHECK(kiln_is_format_error(rc), "read returned %s: %s", kiln_code_name(rc),
		   err->message);
	FUZZ_CHECK(err->code == rc, "err.code %d, rc %d", err->code, rc);
	FUZZ_CHECK(err->message[0] && !strchr(err->message, '\n'), "message: %s", err->message);
	FUZZ_CHECK(strncmp(err->message, path, strlen(path)) == 0, "file not named: %s",
		   err->message);
}

static void check_model(const struct kc_model *m, uint64_t size)
{
	FUZZ_CHECK(m->nsrcs == 1, "%u sources", m->nsrcs);
	uint64_t at = 0;
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		FUZZ_CHECK(t->rank <= KILN_MAX_RANK, "rank %u", t->rank);
		uint64_t count = 1, bits;
		for (unsigned k = 0; k < t->rank; k++)
			if (t->shape[k] == 0)
				count = 0;
		for (unsigned k = 0; k < t->rank && count; k++)
			FUZZ_CHECK(!__builtin_mul_overflow(count, t->shape[k], &count),
				   "shape of %s overflows", t->name);
		FUZZ_CHECK(!__builtin_mul_overflow(count, (uint64_t)bits_of(t), &bits) &&
			       bits % 8 == 0 && bits / 8 == t->byte_length,
			   "%s: %llu bytes for its shape", t->name,
			   (unsigned long long)t->byte_length);
		if (i == 0)
			at = t->src_off;
		FUZZ_CHECK(t->src_off == at, "%s does not start where the previous ended", t->name);
		FUZZ_CHECK(t->src_off >= 8 && t->byte_length <= size - t->src_off,
			   "%s past the file", t->name);
		at += t->byte_length;
		for (uint32_t j = 0; j < i && i < 512; j++)
			FUZZ_CHECK(strcmp(m->tensors[j].name, t->name) != 0, "name %s twice",
				   t->name);
	}
	FUZZ_CHECK(m->n == 0 || at == size, "the payloads end at %llu of %llu",
		   (unsigned long long)at, (unsigned long long)size);
}

static void roundtrip(const struct kc_model *a)
{
	char out[128];
	snprintf(out, sizeof(out), "%s/kiln-fuzz-st-%ld.safetensors",
		 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (long)getpid());
	kiln_error err;
	int rc = kc_st_write(a, out, NULL, &err);
	FUZZ_CHECK(rc == 0, "write of an accepted model: %s", err.message);
	struct kc_model b;
	kc_model_init(&b);
	const char *paths[] = {out};
	rc = kc_st_read(&b, paths, 1, &err);
	FUZZ_CHECK(rc == 0, "reading what was written: %s", err.message);
	unlink(out);
	FUZZ_CHECK(
	    strcmp(json_object_to_json_string(a->meta), json_object_to_json_string(b.meta)) == 0,
	    "metadata %s became %s", json_object_to_json_string(a->meta),
	    json_object_to_json_string(b.meta));
	FUZZ_CHECK(a->n == b.n, "%u tensors became %u", a->n, b.n);
	uint8_t x[256], y[256];
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kc_tensor *s = &a->tensors[i], *t = &b.tensors[i];
		FUZZ_CHECK(s->name_len == t->name_len && memcmp(s->name, t->name, s->name_len) == 0,
			   "name %s became %s", s->name, t->name);
		FUZZ_CHECK(s->dtype == t->dtype && s->rank == t->rank &&
			       memcmp(s->shape, t->shape, sizeof(s->shape)) == 0 &&
			       s->byte_length == t->byte_length && s->block_size == t->block_size,
			   "tensor %s changed", s->name);
		for (uint64_t k = 0; k < s->byte_length; k += sizeof(x)) {
			size_t step = s->byte_length - k < sizeof(x) ? (size_t)(s->byte_length - k)
								     : sizeof(x);
			FUZZ_CHECK(pread(a->srcs[0].fd, x, step, (off_t)(s->src_off + k)) ==
					   (ssize_t)step &&
				       pread(b.srcs[0].fd, y, step, (off_t)(t->src_off + k)) ==
					   (ssize_t)step,
				   "read back");
			FUZZ_CHECK(memcmp(x, y, step) == 0, "payload of %s changed", s->name);
		}
	}
	kc_model_free(&b);
}

int kiln_fuzz_safetensors(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = kiln_fuzz_memfd("fuzz.safetensors", data, size, path);
	struct kc_model m;
	kiln_error err;
	kc_model_init(&m);
	const char *paths[] = {path};
	int rc = kc_st_read(&m, paths, 1, &err);
	if (rc) {
		check_error(rc, &err, path);
	} else {
		check_model(&m, size);
		roundtrip(&m);
	}
	kc_model_free(&m);
	close(fd);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_safetensors(data, size);
}
#endif
