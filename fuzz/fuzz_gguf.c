/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are a GGUF file. kc_gguf_read must refuse it with a well-formed
 * format error (FRAME, TYPE, LIMIT, UTF8: one line naming the file) or accept it with every
 * tensor inside the file, its byte length agreeing with its dtype and shape. An accepted file
 * is written back with kc_gguf_write and read again: the same metadata document and the same
 * payload bytes, or an INVAL refusal naming a tensor or key the writer cannot express.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "ggml_types.h"
#include "model.h"

/* A scratch directory of this process for the written file (removed at exit). */
static char scratch[256], out[300];

static void cleanup(void)
{
	unlink(out);
	rmdir(scratch);
}

static const char *out_path(void)
{
	if (!scratch[0]) {
		const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		snprintf(scratch, sizeof(scratch), "%s/kiln-fuzz-gguf-XXXXXX", base);
		FUZZ_CHECK(mkdtemp(scratch) != NULL, "mkdtemp: %s", strerror(errno));
		snprintf(out, sizeof(out), "%s/out.gguf", scratch);
		atexit(cleanup);
	}
	return out;
}

static void check_error(int rc, const kiln_error *err, const char *path)
{
	FUZZ_CHECK(kiln_is_format_error(rc), "read returned %s: %s", kiln_code_name(rc),
		   err->message);
	FUZZ_CHECK(err->code == rc, "err.code %d, rc %d", err->code, rc);
	FUZZ_CHECK(memchr(err->message, 0, sizeof(err->message)) && err->message[0],
		   "empty or unterminated message");
	FUZZ_CHECK(!strchr(err->message, '\n'), "message is not one line: %s", err->message);
	FUZZ_CHECK(strncmp(err->message, path, strlen(path)) == 0, "message does not name %s: %s",
		   path, err->message);
}

/* The byte size a GGUF tensor of this dtype and shape has, recomputed here. */
static uint64_t expect_bytes(const struct kc_tensor *t)
{
	static const struct {
		uint16_t dt;
		uint32_t size;
	} native[] = {{KILN_DT_F32, 4}, {KILN_DT_F16, 2}, {KILN_DT_BF16, 2}, {KILN_DT_F64, 8},
		      {KILN_DT_I8, 1},  {KILN_DT_I16, 2}, {KILN_DT_I32, 4},  {KILN_DT_I64, 8}};
	uint32_t blck = 1, size = 0;
	for (unsigned i = 0; i < sizeof(native) / sizeof(native[0]); i++)
		if (native[i].dt == t->dtype)
			size = native[i].size;
	if (!size) {
		FUZZ_CHECK(t->dtype >= KILN_DT_OPAQUE_MIN && t->layout, "dtype %u", t->dtype);
		const struct kc_ggml_type *g = kc_ggml_type_by_id(t->dtype - KILN_DT_OPAQUE_MIN);
		FUZZ_CHECK(g && strcmp(g->name, t->layout) == 0 && g->size == t->block_size,
			   "opaque %u %s", t->dtype, t->layout);
		blck = g->blck, size = g->size;
	}
	uint64_t n = 1;
	for (unsigned k = 0; k < t->rank; k++)
		if (t->shape[k] == 0)
			return 0;
	for (unsigned k = 0; k < t->rank; k++)
		FUZZ_CHECK(!__builtin_mul_overflow(n, t->shape[k], &n), "shape overflows");
	FUZZ_CHECK(n % blck == 0, "not whole blocks");
	uint64_t b;
	FUZZ_CHECK(!__builtin_mul_overflow(n / blck, (uint64_t)size, &b), "bytes overflow");
	return b;
}

static void use(const struct kc_model *m, size_t size)
{
	FUZZ_CHECK(m->nsrcs == 1, "%u sources", m->nsrcs);
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		FUZZ_CHECK(t->src == 0 && t->rank <= 4 && t->name_len > 0, "tensor %u", i);
		FUZZ_CHECK(fuzz_utf8_ok((const uint8_t *)t->name, t->name_len), "name of %u", i);
		FUZZ_CHECK(t->byte_length == expect_bytes(t), "byte_length of %s", t->name);
		FUZZ_CHECK(t->src_off <= size && t->byte_length <= size - t->src_off,
			   "tensor %s outside the file", t->name);
		for (uint32_t j = 0; j < i && m->n < 64; j++) {
			const struct kc_tensor *u = &m->tensors[j];
			FUZZ_CHECK(t->name_len != u->name_len ||
				       memcmp(t->name, u->name, t->name_len) != 0,
				   "duplicate name %s", t->name);
			FUZZ_CHECK(!t->byte_length || !u->byte_length ||
				       t->src_off >= u->src_off + u->byte_length ||
				       u->src_off >= t->src_off + t->byte_length,
				   "%s and %s overlap", t->name, u->name);
		}
	}
}

static int payload_equal(const struct kc_model *a, const struct kc_tensor *x,
			 const struct kc_model *b, const struct kc_tensor *y)
{
	uint8_t p[4096], q[4096];
	for (uint64_t done = 0; done < x->byte_length;) {
		size_t n =
		    x->byte_length - done < sizeof(p) ? (size_t)(x->byte_length - done) : sizeof(p);
		if (pread(a->srcs[x->src].fd, p, n, (off_t)(x->src_off + done)) != (ssize_t)n ||
		    pread(b->srcs[y->src].fd, q, n, (off_t)(y->src_off + done)) != (ssize_t)n ||
		    memcmp(p, q, n) != 0)
			return 0;
		done += n;
	}
	return 1;
}

/* The harness's own resource bound, not the writer's: general.alignment may be any power of two
 * up to 2 GiB, and the writer pads the header and every payload to it (test_gguf checks a large
 * one). Writing gigabytes of padding per input would stall the fuzzer, so inputs whose output
 * would pass 64 MiB are parsed and checked but not written back. */
static int output_is_small(const struct kc_model *m)
{
	json_object *g = json_object_object_get(m->meta, "gguf");
	uint64_t a = (uint64_t)json_object_get_int64(json_object_object_get(g, "alignment"));
	uint64_t total = a ? a : 32; /* the header's padding, at most */
	for (uint32_t i = 0; i < m->n && total <= (64u << 20); i++)
		total += m->tensors[i].byte_length + (a ? a : 32);
	return total <= (64u << 20);
}

static void roundtrip(const struct kc_model *m)
{
	if (!output_is_small(m))
		return;
	const char *path = out_path();
	kiln_error err = {0};
	int rc = kc_gguf_write(m, path, NULL, &err);
	if (rc) {
		FUZZ_CHECK(rc == KILN_INVAL, "write returned %s: %s", kiln_code_name(rc),
			   err.message);
		FUZZ_CHECK(access(path, F_OK) != 0, "a refused write left %s", path);
		return;
	}
	struct kc_model b;
	kc_model_init(&b);
	rc = kc_gguf_read(&b, &path, 1, &err);
	FUZZ_CHECK(rc == 0, "the written file is refused: %s", err.message);
	json_object *v = json_object_object_get(json_object_object_get(m->meta, "gguf"), "version");
	int was = json_object_get_int(v);
	json_object_set_int(v, 3); /* the writer writes version 3 */
	const char *ja = json_object_to_json_string_ext(m->meta, JSON_C_TO_STRING_PLAIN);
	const char *jb = json_object_to_json_string_ext(b.meta, JSON_C_TO_STRING_PLAIN);
	FUZZ_CHECK(strcmp(ja, jb) == 0, "metadata differs:\n%s\n%s", ja, jb);
	json_object_set_int(v, was);
	FUZZ_CHECK(b.n == m->n, "%u tensors, then %u", m->n, b.n);
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *x = &m->tensors[i], *y = &b.tensors[i];
		FUZZ_CHECK(x->name_len == y->name_len &&
			       memcmp(x->name, y->name, x->name_len) == 0 && x->dtype == y->dtype &&
			       x->rank == y->rank &&
			       memcmp(x->shape, y->shape, sizeof(x->shape)) == 0 &&
			       x->byte_length == y->byte_length,
			   "tensor %u differs", i);
		FUZZ_CHECK(payload_equal(m, x, &b, y), "payload of %s differs", x->name);
	}
	kc_model_free(&b);
	unlink(path);
}

int kiln_fuzz_gguf(const uint8_t *data, size_t size)
{
	char path[64];
	int fd = kiln_fuzz_memfd("fuzz.gguf", data, size, path);
	const char *p = path;
	struct kc_model m;
	kiln_error err = {0};
	kc_model_init(&m);
	int rc = kc_gguf_read(&m, &p, 1, &err);
	if (rc) {
		check_error(rc, &err, path);
	} else {
		use(&m, size);
		roundtrip(&m);
	}
	kc_model_free(&m);
	close(fd);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_gguf(data, size);
}
#endif
