/* SPDX-License-Identifier: MIT */
/*
 * Fuzz targets, one per entry point. Each body is a plain function so the same code runs under
 * libFuzzer (fuzz/<target>.c built with KILN_LIBFUZZER, see fuzz/CMakeLists.txt) and in the
 * replay test (tests/test_fuzz_replay.c), which feeds it the committed corpus and the crash
 * reproducers in any build, gcc included.
 *
 * A target returns 0 for every input. A broken invariant is a bug in kiln (or in the target): it
 * prints what disagreed and calls abort(), which libFuzzer and Criterion both report as a crash.
 */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Parse with and without payload verification and trailing bytes; use every view of a valid
 * result. */
int kiln_fuzz_parse(const uint8_t *data, size_t size);
/* Decode a tensor list, write it, read it back: same fields, same bytes, or a format refusal. */
int kiln_fuzz_roundtrip(const uint8_t *data, size_t size);
/* Build a directory of chosen names and look names up; compare with a linear scan. */
int kiln_fuzz_lookup(const uint8_t *data, size_t size);
/* The bytes are a safetensors file, opened every way (buffer, mmap, read, uring; the format
 * forced and told from the bytes; counting and failing allocators): one verdict, the one the
 * target's own reading of the rules gives, and an accepted file's views and metadata are what
 * the header says (fuzz/fuzz_model.h). */
int kiln_fuzz_safetensors(const uint8_t *data, size_t size);
/* The same for a GGUF file: tensor infos and every key/value checked against the file's bytes. */
int kiln_fuzz_gguf(const uint8_t *data, size_t size);
/* The bytes are a server's answer to the REMOTE source (or, after a 'C', an AWS credentials
 * file): no crash, leak or overread, and only a 2xx answer opens. */
int kiln_fuzz_http(const uint8_t *data, size_t size);

/* The body of an error answer: the <Code> and <Message> kiln quotes, exactly and printable. */
int kiln_fuzz_s3error(const uint8_t *data, size_t size);
/* An AWS credentials or config file (after a section line and a key line): the value the INI
 * reader gives is the target's own reading's. */
int kiln_fuzz_awsconfig(const uint8_t *data, size_t size);
/* A safetensors index at a URL or a local path (the first byte picks): every file an accepted
 * index names is below its directory, on its side of local/remote. */
int kiln_fuzz_index(const uint8_t *data, size_t size);
/* Cache entry names, made from a URL, ETag and size, or found in a directory. */
int kiln_fuzz_cache(const uint8_t *data, size_t size);
/* A digest table (a sidecar's bytes): the verdict and fields the target's own reading of its
 * rules gives. */
int kiln_fuzz_digest(const uint8_t *data, size_t size);
/* A model_signing statement or sigstore bundle (model.sig): a located refusal, or digests in
 * sorted, non-overlapping ranges. */
int kiln_fuzz_signing(const uint8_t *data, size_t size);

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#endif

static inline void kiln__fuzz_fail(const char *file, int line, const char *cond, const char *fmt,
				   ...) __attribute__((noreturn, format(printf, 4, 5)));
static inline void kiln__fuzz_fail(const char *file, int line, const char *cond, const char *fmt,
				   ...)
{
	va_list ap;
	fprintf(stderr, "%s:%d: invariant failed: %s: ", file, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

/* The input as a C string (malloc'ed, NUL appended; it ends at its first NUL for string
 * parsers), or NULL when memory runs out (the target then returns 0). */
static inline char *kiln__fuzz_cstr(const uint8_t *data, size_t size)
{
	char *s = (char *)malloc(size + 1);
	if (s) {
		for (size_t i = 0; i < size; i++)
			s[i] = (char)data[i];
		s[size] = '\0';
	}
	return s;
}

/* Abort with a message unless cond holds. */
#define FUZZ_CHECK(cond, ...)                                                    \
	do {                                                                     \
		if (!(cond))                                                     \
			kiln__fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
	} while (0)

/* Reading fuzz input: past the end every read yields zeros, so any input decodes. */
struct fuzz_in {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static inline uint16_t fuzz_u16(struct fuzz_in *in)
{
	uint16_t v = fuzz_u8(in);
	return (uint16_t)(v | fuzz_u8(in) << 8);
}

static inline uint32_t fuzz_u32(struct fuzz_in *in)
{
	uint32_t v = fuzz_u16(in);
	return v | (uint32_t)fuzz_u16(in) << 16;
}

static inline uint64_t fuzz_u64(struct fuzz_in *in)
{
	uint64_t v = fuzz_u32(in);
	return v | (uint64_t)fuzz_u32(in) << 32;
}

/* Up to `want` bytes of input, in place; *got says how many. */
static inline const uint8_t *fuzz_bytes(struct fuzz_in *in, size_t want, size_t *got)
{
	const uint8_t *p = in->p;
	*got = want < in->n ? want : in->n;
	in->p += *got;
	in->n -= *got;
	return p;
}

/* RFC 3629, written independently of src/utf8.c (decode, then range-check the code point) so
 * the targets can predict the reader's verdict on a name. */
static inline int fuzz_utf8_ok(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint8_t c = s[i];
		size_t k;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xE0) == 0xC0) {
			k = 1, cp = c & 0x1Fu, min = 0x80;
		} else if ((c & 0xF0) == 0xE0) {
			k = 2, cp = c & 0x0Fu, min = 0x800;
		} else if ((c & 0xF8) == 0xF0) {
			k = 3, cp = c & 0x07u, min = 0x10000;
		} else {
			return 0;
		}
		if (n - i - 1 < k)
			return 0;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xC0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + j] & 0x3Fu);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return 0;
		i += k + 1;
	}
	return 1;
}

#ifdef MFD_CLOEXEC /* targets that include <sys/mman.h> with _GNU_SOURCE */
#include <errno.h>
#include <string.h>
#include <unistd.h>
/* Files for the bytes: put them in a memfd and name it by its /proc/self/fd path (path holds
 * at least 64 bytes). Returns the descriptor to close. */
static inline int kiln_fuzz_memfd(const char *name, const uint8_t *data, size_t size, char *path)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
	for (size_t w = 0; w < size;) {
		ssize_t k = write(fd, data + w, size - w);
		FUZZ_CHECK(k > 0, "write: %s", strerror(errno));
		w += (size_t)k;
	}
	snprintf(path, 64, "/proc/self/fd/%d", fd);
	return fd;
}
#endif

#endif
