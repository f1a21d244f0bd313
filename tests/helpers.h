/* SPDX-License-Identifier: MIT */
/* Shared test helpers: hex fixtures, byte patching, temporary files. */
#ifndef KILN_TEST_HELPERS_H
#define KILN_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "kiln/kiln.h"
#include "kiln/toolkit.h"

/* Offsets from the spec (docs/klnt-v2.md), spelled out here rather than taken from src/. */
#define H_FLAGS           5
#define H_COUNT           8
#define H_NAME_BYTES      12
#define H_PAYLOAD_BYTES   16
#define H_DIRECTORY_BYTES 24
#define D(i)              (64u + 128u * (unsigned)(i))
#define F_DTYPE           0
#define F_RANK            2
#define F_NAME_OFF        4
#define F_NAME_LEN        6
#define F_LAYOUT_OFF      8
#define F_LAYOUT_LEN      10
#define F_BLOCK_SIZE      12
#define F_SCHEME          16
#define F_AXIS            18
#define F_GROUP           20
#define F_SCALE           24
#define F_OUTER           28
#define F_BYTE_OFFSET     32
#define F_BYTE_LENGTH     40
#define F_SHAPE           48

typedef struct {
	uint8_t *p;
	size_t len;
} blob;

/* preadv made of kiln__sys.pread calls, one an iovec, ending at the first that fails or comes
 * back short: a test that fakes pread sets kiln__sys.preadv to this so gathered reads
 * (src/io/engine.c) meet its faults too. */
ssize_t kt_preadv_by_pread(int fd, const struct iovec *iov, int iovcnt, off_t off);
/* An mmap that fails with ENODEV, as on a file system that cannot map files: for
 * kiln__sys.mmap. */
void *kt_mmap_enodev(void *addr, size_t len, int prot, int flags, int fd, off_t off);

/* Read golden/<name>.hex (hex pairs, '#' comments). Aborts the test on error. */
blob load_golden(const char *name);
/* Parse hex text. */
blob hex_decode(const char *text);
/* Encode tensors with kiln_write_memory; asserts success. */
blob build(const kiln_tensor_spec *t, uint32_t n);
void blob_free(blob *b);
/* Resize (new bytes zero). */
void blob_resize(blob *b, size_t len);

void put16(blob *b, size_t off, uint16_t v);
void put32(blob *b, size_t off, uint32_t v);
void put64(blob *b, size_t off, uint64_t v);
uint64_t get64(const blob *b, size_t off);

/* n pseudo-random bytes into p from the 64-bit LCG at *state (advanced): the same seed gives
 * the same bytes in every suite. */
void fill_random(uint8_t *p, uint64_t n, uint64_t *state);
/* "dir/name" (malloc'd). */
char *join(const char *dir, const char *name);
/* The file at `path` made to hold exactly bytes[0, n) (created or truncated). */
void put_file(const char *path, const void *bytes, size_t n);
/* dir/name holding bytes[0, n); returns the path (malloc'd). */
char *save(const char *dir, const char *name, const void *bytes, size_t n);
/* The whole file at `path` (malloc'd, with a NUL after its last byte); its length in *len. */
uint8_t *slurp(const char *path, size_t *len);
/* Write bytes to a fresh file under the test scratch directory; returns a malloc'd path. */
char *write_temp(const void *p, size_t len);
/* A fresh scratch directory path (malloc'd), created. */
char *temp_dir(void);
/* A fresh scratch directory five 40-character names below one (malloc'd), created: its files'
 * paths pass the 223 bytes of kiln_error.message, as a hub cache's snapshots/<hash>/ can. */
char *deep_dir(void);

/* A kiln_allocator context that counts the index memory: live and peak bytes, calls; requests
 * above `cap` (when nonzero) fail. Use as {count_alloc, count_free, &counting}. */
struct counting {
	size_t live, peak, calls, cap;
};
void *count_alloc(void *ctx, size_t size);
void count_free(void *ctx, void *p, size_t size);

/* Parse b with flags (plus VERIFY) and assert the result: code, tensor index and field.
 * field may be NULL to skip the field check. */
void expect_reject(const blob *b, int code, uint64_t tensor, const char *field);
void expect_valid(const blob *b);
/* kiln_model_open(path) fails with IO and errno want_errno, sets *out to NULL, and the message
 * names the file. */
void expect_io(const char *path, int want_errno);

/* SHA-256 of msg[0, len) as 64 lowercase hex digits (FIPS 180-4; test_formats checks the known
 * answers), for the samples' expected payload digests. */
void sha256(const uint8_t *msg, uint64_t len, char hex[65]);

#endif
