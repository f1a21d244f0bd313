/* SPDX-License-Identifier: MIT */
#include "helpers.h"
#include "base/sys.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

blob hex_decode(const char *text)
{
	blob b = {malloc(strlen(text) / 2 + 1), 0};
	cr_assert_not_null(b.p);
	int hi = -1;
	for (const char *s = text; *s; s++) {
		if (*s == '#') {
			while (*s && *s != '\n')
				s++;
			if (!*s)
				break;
			continue;
		}
		if (isspace((unsigned char)*s))
			continue;
		cr_assert(isxdigit((unsigned char)*s), "bad hex character '%c'", *s);
		int v =
		    isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
		if (hi < 0) {
			hi = v;
		} else {
			b.p[b.len++] = (uint8_t)(hi << 4 | v);
			hi = -1;
		}
	}
	cr_assert_eq(hi, -1, "odd number of hex digits");
	return b;
}

blob load_golden(const char *name)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s.hex", KILN_GOLDEN_DIR, name);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "cannot open %s", path);
	char *text = NULL;
	size_t cap = 0;
	ssize_t n = getdelim(&text, &cap, '\0', f);
	fclose(f);
	cr_assert(n > 0, "%s is empty", path);
	blob b = hex_decode(text);
	free(text);
	return b;
}

blob build(const kiln_tensor_spec *t, uint32_t n)
{
	uint64_t len = 0;
	kiln_error err;
	int rc = kiln_write_size(t, n, &len, &err);
	cr_assert_eq(rc, 0, "kiln_write_size: %s: %s", kiln_code_name(rc), err.message);
	blob b = {malloc(len ? len : 1), 0};
	cr_assert_not_null(b.p);
	rc = kiln_write_memory(t, n, b.p, len, &b.len, &err);
	cr_assert_eq(rc, 0, "kiln_write_memory: %s: %s", kiln_code_name(rc), err.message);
	cr_assert_eq(b.len, len);
	return b;
}

void blob_free(blob *b)
{
	free(b->p);
	b->p = NULL;
	b->len = 0;
}

void blob_resize(blob *b, size_t len)
{
	b->p = realloc(b->p, len ? len : 1);
	cr_assert_not_null(b->p);
	if (len > b->len)
		memset(b->p + b->len, 0, len - b->len);
	b->len = len;
}

void put16(blob *b, size_t off, uint16_t v)
{
	cr_assert_leq(off + 2, b->len);
	b->p[off] = (uint8_t)v;
	b->p[off + 1] = (uint8_t)(v >> 8);
}

void put32(blob *b, size_t off, uint32_t v)
{
	put16(b, off, (uint16_t)v);
	put16(b, off + 2, (uint16_t)(v >> 16));
}

void put64(blob *b, size_t off, uint64_t v)
{
	put32(b, off, (uint32_t)v);
	put32(b, off + 4, (uint32_t)(v >> 32));
}

uint64_t get64(const blob *b, size_t off)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b->p[off + (size_t)i];
	return v;
}

/* Where test files go: KILN_TEST_TMPDIR when set (a build carried to another machine, where the
 * build tree's path does not exist), else the build tree's test-tmp. Not /tmp: it may be tmpfs,
 * where O_DIRECT and page-cache eviction behave differently. */
static const char *test_tmp(void)
{
	const char *d = getenv("KILN_TEST_TMPDIR");
	return d && *d ? d : KILN_TEST_TMP;
}

char *temp_dir(void)
{
	char *path;
	cr_assert(asprintf(&path, "%s/scratch-XXXXXX", test_tmp()) > 0);
	mkdir(test_tmp(), 0777);
	cr_assert_not_null(mkdtemp(path), "mkdtemp %s", path);
	return path;
}

char *join(const char *dir, const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

void put_file(const char *path, const void *bytes, size_t n)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fwrite(bytes, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

char *save(const char *dir, const char *name, const void *bytes, size_t n)
{
	char *path = join(dir, name);
	put_file(path, bytes, n);
	return path;
}

uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	cr_assert_geq(n, 0);
	rewind(f);
	uint8_t *b = malloc((size_t)n + 1);
	cr_assert_not_null(b);
	cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	b[n] = 0;
	*len = (size_t)n;
	return b;
}

char *deep_dir(void)
{
	char *top = temp_dir(), *path = NULL;
	size_t n = strlen(top) + 5 * 41 + 1;
	path = malloc(n);
	cr_assert_not_null(path);
	snprintf(path, n, "%s", top);
	free(top);
	for (int i = 0; i < 5; i++) {
		size_t at = strlen(path);
		snprintf(path + at, n - at, "/%040d", i);
		cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
	}
	return path;
}

char *write_temp(const void *p, size_t len)
{
	char *path;
	cr_assert(asprintf(&path, "%s/file-XXXXXX", test_tmp()) > 0);
	mkdir(test_tmp(), 0777);
	int fd = mkstemp(path);
	cr_assert(fd >= 0, "mkstemp %s", path);
	cr_assert_eq(write(fd, p, len), (ssize_t)len);
	close(fd);
	return path;
}

/* With KILN_DUMP_DIR set, every block a test expects to be rejected is also written there as
 * CLASS-field-pid-n.klnt, so the CLI test can run `klnt check` over the same single-defect
 * blocks and compare verdicts. */
static void dump_block(const blob *b, int code, const char *field)
{
	const char *dir = getenv("KILN_DUMP_DIR");
	if (!dir)
		return;
	static unsigned serial;
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s-%s-%ld-%u.klnt", dir, kiln_code_name(code),
		 field ? field : "any", (long)getpid(), serial++);
	for (char *c = path + strlen(dir) + 1; *c; c++)
		if (*c == ' ')
			*c = '_';
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot write %s", path);
	cr_assert_eq(fwrite(b->p, 1, b->len, f), b->len);
	fclose(f);
}

void expect_reject(const blob *b, int code, uint64_t tensor, const char *field)
{
	dump_block(b, code, field);
	kiln_error err;
	int rc = kiln_validate(b->p, b->len, KILN_OPEN_VERIFY_PAYLOAD, &err);
	cr_assert_eq(rc, code, "expected %s, got %s: %s", kiln_code_name(code), kiln_code_name(rc),
		     err.message);
	cr_assert_eq(err.code, code);
	cr_assert_eq(err.tensor, tensor, "expected tensor %" PRIu64 ", got %" PRIu64 ": %s", tensor,
		     err.tensor, err.message);
	if (field)
		cr_assert(err.field && strcmp(err.field, field) == 0,
			  "expected field %s, got %s: %s", field, err.field ? err.field : "(null)",
			  err.message);
	cr_assert_eq(err.file, 0, "a rejected buffer is file 0, got %" PRIu32 ": %s", err.file,
		     err.message);
	cr_assert(err.message[0] != '\0', "empty message");
	cr_assert_null(strchr(err.message, '\n'), "message is not one line");
	if (err.offset != KILN_NO_OFFSET)
		cr_assert_lt(err.offset, b->len > 0 ? b->len : 1, "offset %llu past the block",
			     (unsigned long long)err.offset);
}

void expect_valid(const blob *b)
{
	kiln_error err;
	int rc = kiln_validate(b->p, b->len, KILN_OPEN_VERIFY_PAYLOAD, &err);
	cr_assert_eq(rc, 0, "expected valid, got %s: %s", kiln_code_name(rc), err.message);
}

void *count_alloc(void *ctx, size_t size)
{
	struct counting *c = ctx;
	if (c->cap && size > c->cap)
		return NULL;
	void *p = malloc(size);
	if (p) {
		c->live += size;
		c->calls++;
		if (c->live > c->peak)
			c->peak = c->live;
	}
	return p;
}

void count_free(void *ctx, void *p, size_t size)
{
	struct counting *c = ctx;
	c->live -= size;
	free(p);
}

void expect_io(const char *path, int want_errno)
{
	kiln_model *dir = (kiln_model *)1;
	kiln_error err;
	int rc = kiln_model_open(path, NULL, &dir, &err);
	cr_assert_eq(rc, KILN_IO, "%s: got %s: %s", path, kiln_code_name(rc), err.message);
	cr_assert_null(dir);
	cr_assert_eq(err.sys_errno, want_errno, "%s: errno %d (%s), want %d", path, err.sys_errno,
		     strerror(err.sys_errno), want_errno);
	cr_assert_not_null(strstr(err.message, path), "the message names the file: %s",
			   err.message);
	cr_assert_eq(err.file, 0, "the error is about file 0, got %" PRIu32, err.file);
	cr_assert(!kiln_is_format_error(rc));
}

/* SHA-256 (FIPS 180-4), for the samples' expected payload digests. */
void sha256(const uint8_t *msg, uint64_t len, char hex[65])
{
	static const uint32_t k[64] = {
	    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	    0xc67178f2};
	uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
			 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	uint64_t total = (len + 9 + 63) / 64 * 64;
	uint8_t blk[64];
#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))
	for (uint64_t off = 0; off < total; off += 64) {
		for (int i = 0; i < 64; i++) {
			uint64_t j = off + (uint64_t)i;
			blk[i] = j < len ? msg[j] : j == len ? 0x80 : 0;
			if (j >= total - 8)
				blk[i] = (uint8_t)((len * 8) >> (8 * (total - 1 - j)));
		}
		uint32_t w[64];
		for (int i = 0; i < 16; i++)
			w[i] = (uint32_t)blk[4 * i] << 24 | (uint32_t)blk[4 * i + 1] << 16 |
			       (uint32_t)blk[4 * i + 2] << 8 | blk[4 * i + 3];
		for (int i = 16; i < 64; i++) {
			uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
			uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
			w[i] = w[i - 16] + s0 + w[i - 7] + s1;
		}
		uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6],
			 hh = h[7];
		for (int i = 0; i < 64; i++) {
			uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) +
				      ((e & f) ^ (~e & g)) + k[i] + w[i];
			uint32_t t2 =
			    (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
			hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
		}
		h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g,
		    h[7] += hh;
	}
#undef ROR
	for (int i = 0; i < 8; i++)
		snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

void fill_random(uint8_t *p, uint64_t n, uint64_t *state)
{
	uint64_t x = *state;
	for (uint64_t k = 0; k < n; k++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		p[k] = (uint8_t)(x >> 56);
	}
	*state = x;
}

void *kt_mmap_enodev(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	(void)addr, (void)len, (void)prot, (void)flags, (void)fd, (void)off;
	errno = ENODEV;
	return MAP_FAILED;
}

ssize_t kt_preadv_by_pread(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
	ssize_t total = 0;
	for (int i = 0; i < iovcnt; i++) {
		ssize_t r = kiln__sys.pread(fd, iov[i].iov_base, iov[i].iov_len, off + total);
		if (r < 0)
			return total ? total : -1;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return total;
}
