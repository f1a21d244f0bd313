/* SPDX-License-Identifier: MIT */
/*
 * Content digests (kiln/verify.h):
 * - hash/100KiB: kiln's XXH3-128 (src/format/digest.h: Debian's libxxhash, run-time dispatch) of
 *   a 100 KiB buffer in cache, the sample `xxhsum -b` times, so the two rates compare;
 *   hash/1MiB_chunks: of a 256 MiB buffer in 1 MiB chunks, out of cache (memory-bound), beside
 *   memcpy/256MiB, the same bytes copied;
 * - verify_warm: kiln_model_verify_digests() of a 256 MiB file in the page cache (every byte
 *   read and hashed), beside read_warm: the same file read with pread in 1 MiB blocks into one
 *   reused buffer (what the verification reads, without the hash). verify / read is the cost of
 *   checking a warm file.
 * - write/klnt/digests, write/klnt/none: kiln_write_file() of the same 256 MiB tensor into the
 *   page cache (KILN_WRITE_NO_SYNC: no disk to hide the hash behind), with the file's digest
 *   table (the default) and without (KILN_WRITE_NO_DIGESTS); write/safetensors/... the same
 *   through kiln_safetensors_write_file(). none / digests is the writers' cost of the table.
 * Files go to $KILN_BENCH_DIR (default ./bench-files) and are removed at exit; KILN_BENCH_SMOKE
 * makes everything tiny.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/digest.h"
#include "kiln/kiln.h"
#include "shim.h"

static char *dir_path, *file_path, *sidecar_path, *out_path;
static uint8_t *big, *big_copy;
static size_t big_len, file_len;

static void cleanup(void)
{
	if (sidecar_path)
		unlink(sidecar_path);
	if (out_path)
		unlink(out_path);
	free(out_path);
	if (file_path)
		unlink(file_path);
	if (dir_path)
		rmdir(dir_path);
	free(sidecar_path);
	free(file_path);
	free(dir_path);
	free(big);
	free(big_copy);
}

static void hash_small(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	uint8_t d[KILN__DIGEST_LEN];
	for (uint64_t i = 0; i < iters; i++) {
		kiln__digest_bytes(big, 100 << 10, d);
		big[0] ^= d[0]; /* the next hash depends on this one: nothing is hoisted */
	}
	kb_set_bytes_per_iter(st, 100 << 10);
}

static void hash_chunks(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	uint8_t d[KILN__DIGEST_LEN];
	for (uint64_t i = 0; i < iters; i++)
		for (size_t at = 0; at < big_len; at += 1 << 20) {
			kiln__digest_bytes(big + at, 1 << 20, d);
			big[at] ^= d[0];
		}
	kb_set_bytes_per_iter(st, big_len);
}

static void copy_big(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	for (uint64_t i = 0; i < iters; i++) {
		memcpy(big_copy, big, big_len);
		big[i % big_len] ^= big_copy[big_len - 1];
	}
	kb_set_bytes_per_iter(st, big_len);
}

static void verify_warm(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	kiln_model *m;
	kiln_error err;
	if (kiln_model_open(file_path, NULL, &m, &err)) {
		kb_skip(st, err.message);
		return;
	}
	kiln_verify_report r;
	for (uint64_t i = 0; i < iters; i++)
		if (kiln_model_verify_digests(m, NULL, &r, &err)) {
			kb_skip(st, err.message);
			break;
		}
	kiln_model_close(m);
	kb_set_bytes_per_iter(st, file_len);
}

static void read_warm(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	size_t block = 1 << 20;
	uint8_t *buf = malloc(block);
	int fd = open(file_path, O_RDONLY | O_CLOEXEC);
	for (uint64_t i = 0; i < iters && fd >= 0 && buf; i++)
		for (size_t at = 0; at < file_len;) {
			ssize_t n = pread(fd, buf, block, (off_t)at);
			if (n <= 0)
				break;
			at += (size_t)n;
		}
	if (fd >= 0)
		close(fd);
	free(buf);
	kb_set_bytes_per_iter(st, file_len);
}

/* The one tensor every file here holds: `big`, as a u8 vector named w. */
static kiln_tensor_spec big_tensor(void)
{
	return (kiln_tensor_spec){.name = "w",
				  .name_len = 1,
				  .dtype = KILN_DT_U8,
				  .rank = 1,
				  .shape = {big_len},
				  .byte_length = big_len,
				  .data = big};
}

/* Writing: arg bit 0 set, without the digest table; bit 1 set, safetensors. */
static void write_file(kb_state *st, uint64_t iters, void *arg)
{
	uintptr_t how = (uintptr_t)arg;
	uint32_t flags = KILN_WRITE_NO_SYNC | (how & 1 ? KILN_WRITE_NO_DIGESTS : 0);
	kiln_tensor_spec t = big_tensor();
	kiln_error err;
	for (uint64_t i = 0; i < iters; i++) {
		int rc = how & 2
			     ? kiln_safetensors_write_file(out_path, &t, 1, NULL, 0, flags, &err)
			     : kiln_write_file(out_path, &t, 1, flags, &err);
		if (rc) {
			kb_skip(st, err.message);
			break;
		}
	}
	kb_set_bytes_per_iter(st, big_len);
}

/* A 256 MiB KLNT file of one u8 tensor of random bytes, and its sidecar (1 MiB chunks). */
static int make_file(void)
{
	const char *base = getenv("KILN_BENCH_DIR");
	if (asprintf(&dir_path, "%s/verify-%d", base ? base : "bench-files", (int)getpid()) < 0 ||
	    asprintf(&file_path, "%s/m.klnt", dir_path) < 0 ||
	    asprintf(&sidecar_path, "%s.kiln-digest", file_path) < 0 ||
	    asprintf(&out_path, "%s/out", dir_path) < 0)
		return -1;
	if (base)
		mkdir(base, 0755);
	else
		mkdir("bench-files", 0755);
	if (mkdir(dir_path, 0755))
		return -1;
	kiln_tensor_spec t = big_tensor();
	kiln_error err;
	kiln_model *m;
	if (kiln_write_file(file_path, &t, 1, KILN_WRITE_NO_SYNC, &err) ||
	    kiln_model_open(file_path, NULL, &m, &err)) {
		fprintf(stderr, "bench_verify: %s\n", err.message);
		return -1;
	}
	kiln_digest_options o = {.flags = KILN_WRITE_NO_SYNC};
	int rc = kiln_model_write_digests(m, &o, NULL, &err);
	kiln_model_close(m);
	if (rc) {
		fprintf(stderr, "bench_verify: %s\n", err.message);
		return -1;
	}
	struct stat s;
	if (stat(file_path, &s))
		return -1;
	file_len = (size_t)s.st_size;
	return 0;
}

int main(int argc, char **argv)
{
	big_len = getenv("KILN_BENCH_SMOKE") ? (size_t)2 << 20 : (size_t)256 << 20;
	big = malloc(big_len);
	big_copy = malloc(big_len);
	if (!big || !big_copy)
		return 1;
	uint64_t x = 1;
	for (size_t i = 0; i < big_len; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		big[i] = (uint8_t)(x >> 56);
	}
	memset(big_copy, 1, big_len);
	atexit(cleanup);
	if (make_file())
		return 1;
	kb_register("hash/100KiB", hash_small, NULL);
	kb_register("hash/1MiB_chunks", hash_chunks, NULL);
	kb_register("memcpy/256MiB", copy_big, NULL);
	kb_register("verify_warm", verify_warm, NULL);
	kb_register("read_warm", read_warm, NULL);
	kb_register("write/klnt/digests", write_file, (void *)0);
	kb_register("write/klnt/none", write_file, (void *)1);
	kb_register("write/safetensors/digests", write_file, (void *)2);
	kb_register("write/safetensors/none", write_file, (void *)3);
	return kb_main(argc, argv);
}
