/* SPDX-License-Identifier: MIT */
/*
 * Warm open: kiln_model_open + structural validation + close, on files in the page cache.
 * - KLNT, safetensors and GGUF files, the stock formats at 300 / 3,000 / 100,000 tensors, and a
 *   metadata-only GGUF (a 4 MiB vocabulary) against reading the same file once, into a reused
 *   buffer and into fresh memory like the header copy open keeps;
 * - by tensor count (1 .. 300,000, tiny payloads): cost should grow linearly with the count;
 * - 300 tensors with 1 MiB vs 4 GiB of payload: cost should not depend on the payload, since
 *   open reads only the directory. The 4 GiB file is sparse (its payload is a hole), which is
 *   fair because open never reads payload pages (tests/test_open.c proves that with mincore).
 * Files go to $KILN_BENCH_DIR (default ./bench-files) and are removed at exit.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "shim.h"

/* open + validate + close; with `lookups`, as the targets are measured: every tensor
 * looked up by its name (by index when unnamed) before the close. */
static volatile uintptr_t sink;
static void open_loop(kb_state *st, uint64_t iters, const char *path, int lookups, uint32_t flags)
{
	kiln_open_options o = {.size = sizeof(o), .flags = flags};
	for (uint64_t i = 0; i < iters; i++) {
		kiln_model *dir;
		kiln_error err;
		if (kiln_model_open(path, &o, &dir, &err) != 0) {
			kb_skip(st, err.message);
			return;
		}
		uint32_t n = lookups ? kiln_model_count(dir) : 0;
		for (uint32_t k = 0; k < n; k++) {
			const kiln_tensor *t = kiln_model_tensor(dir, k);
			if (t->name_len)
				t = kiln_model_find(dir, t->name, t->name_len);
			sink ^= (uintptr_t)t->data;
		}
		kiln_model_close(dir);
	}
}

static void open_body(kb_state *st, uint64_t iters, void *arg)
{
	open_loop(st, iters, arg, 0, 0);
}

static void open_lookup_body(kb_state *st, uint64_t iters, void *arg)
{
	open_loop(st, iters, arg, 1, 0);
}

/* KILN_OPEN_PACK_VIEWS: what packing costs an open, and an open that then uses every view. */
static void packed_open_body(kb_state *st, uint64_t iters, void *arg)
{
	open_loop(st, iters, arg, 0, KILN_OPEN_PACK_VIEWS);
}

static void packed_lookup_body(kb_state *st, uint64_t iters, void *arg)
{
	open_loop(st, iters, arg, 1, KILN_OPEN_PACK_VIEWS);
}

static void register_packed(const char *what, char *path)
{
	char name[128];
	static const struct {
		const char *packing, *op;
		void (*body)(kb_state *, uint64_t, void *);
	} rows[] = {{"unpacked", "open", open_body},
		    {"packed", "open", packed_open_body},
		    {"unpacked", "open_lookup_close", open_lookup_body},
		    {"packed", "open_lookup_close", packed_lookup_body}};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		snprintf(name, sizeof(name), "%s/%s/tensors:3000/%s", rows[i].packing, what,
			 rows[i].op);
		kb_register(name, rows[i].body, path);
	}
}

/* The floor: what any loader of a mapped file pays, with no format at all. */
static void floor_body(kb_state *st, uint64_t iters, void *arg)
{
	const char *path = arg;
	for (uint64_t i = 0; i < iters; i++) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		struct stat sb;
		if (fd < 0 || fstat(fd, &sb)) {
			kb_skip(st, "open or fstat failed");
			return;
		}
		void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			kb_skip(st, "mmap failed");
			return;
		}
		munmap(p, (size_t)sb.st_size);
		close(fd);
	}
}

/* Reading the whole file once into a reused buffer: what opening a metadata-only GGUF (whose
 * header is the file) is measured against. */
static void read_body(kb_state *st, uint64_t iters, void *arg)
{
	const char *path = arg;
	static char *buf;
	static size_t cap;
	for (uint64_t i = 0; i < iters; i++) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		struct stat sb;
		if (fd < 0 || fstat(fd, &sb)) {
			kb_skip(st, "open or fstat failed");
			return;
		}
		if ((size_t)sb.st_size > cap) {
			free(buf);
			cap = (size_t)sb.st_size;
			buf = malloc(cap);
		}
		for (off_t at = 0; buf && at < sb.st_size;) {
			ssize_t r = pread(fd, buf + at, (size_t)(sb.st_size - at), at);
			if (r <= 0)
				break;
			at += r;
		}
		sink ^= buf ? (uintptr_t)buf[0] : 0;
		close(fd);
	}
}

/* The same read into fresh memory of the kind kiln keeps a large header in (a mapping of its
 * own with huge pages, src/base/mem.c): what a reader that keeps the bytes pays. */
static void read_fresh_body(kb_state *st, uint64_t iters, void *arg)
{
	const char *path = arg;
	for (uint64_t i = 0; i < iters; i++) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		struct stat sb;
		if (fd < 0 || fstat(fd, &sb)) {
			kb_skip(st, "open or fstat failed");
			return;
		}
		size_t len = ((size_t)sb.st_size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
		char *buf = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (buf == MAP_FAILED) {
			close(fd);
			kb_skip(st, "mmap failed");
			return;
		}
		madvise(buf, len, MADV_HUGEPAGE);
		for (off_t at = 0; at < sb.st_size;) {
			ssize_t r = pread(fd, buf + at, (size_t)(sb.st_size - at), at);
			if (r <= 0)
				break;
			at += r;
		}
		sink ^= (uintptr_t)buf[0];
		munmap(buf, len ? len : 1);
		close(fd);
	}
}

/* The target rows for one file: floor, open, open + every lookup. */
static void register_targets(const char *what, uint32_t count, char *path)
{
	char name[128];
	snprintf(name, sizeof(name), "target/%s/tensors:%u/floor", what, count);
	kb_register(name, floor_body, path);
	snprintf(name, sizeof(name), "target/%s/tensors:%u/open_lookup_close", what, count);
	kb_register(name, open_lookup_body, path);
}

int main(int argc, char **argv)
{
	int smoke = getenv("KILN_BENCH_SMOKE") != NULL;
	static const uint32_t counts[] = {1, 300, 3000, 30000, 300000};
	char name[128];
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		if (smoke && counts[i] > 3000)
			break;
		char *path = kbu_tensors_file(counts[i], 16, 0, 0);
		snprintf(name, sizeof(name), "warm_open/unnamed/tensors:%u", counts[i]);
		kb_register(name, open_body, path);
		if (counts[i] == 300000)
			register_targets("unnamed", counts[i], path);
	}
	/* Named: each name is hashed and checked for duplicates. The heap's u16 offsets cap how
	 * many names fit (about 7,000 of this length). */
	static const uint32_t named[] = {1, 300, 3000};
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		char *path = kbu_tensors_file(named[i], 16, 0, 1);
		snprintf(name, sizeof(name), "warm_open/named/tensors:%u", named[i]);
		kb_register(name, open_body, path);
		if (named[i] >= 300)
			register_targets("named", named[i], path);
		if (named[i] == 3000)
			register_packed("named", path);
	}
	/* The 16,000: more short names than one heap holds, so unnamed. */
	if (!smoke)
		register_targets("unnamed", 16000, kbu_tensors_file(16000, 16, 0, 0));
	/* Stock files, opened directly: safetensors (a JSON header), GGUF (a binary header, and a
	 * tokenizer's vocabulary among its key/values). */
	static const uint32_t stock[] = {300, 3000, 100000};
	for (size_t i = 0; i < sizeof(stock) / sizeof(stock[0]); i++) {
		if (smoke && stock[i] > 3000)
			break;
		snprintf(name, sizeof(name), "warm_open/safetensors/tensors:%u", stock[i]);
		kb_register(name, open_body, kbu_safetensors_file(stock[i]));
		if (stock[i] <= 3000) {
			char *gguf = kbu_gguf_file(stock[i], 0);
			snprintf(name, sizeof(name), "warm_open/gguf/tensors:%u", stock[i]);
			kb_register(name, open_body, gguf);
			if (stock[i] == 3000)
				register_packed("gguf", gguf);
		}
	}
	char *vocab = kbu_gguf_file(0, smoke ? (256u << 10) : (4u << 20));
	kb_register("warm_open/gguf/vocab_only", open_body, vocab);
	kb_register("warm_read/gguf/vocab_only", read_body, vocab);
	kb_register("warm_read_fresh/gguf/vocab_only", read_fresh_body, vocab);
	/* Same tensor count, payload 1 MiB vs 4 GiB (sparse). */
	char *small = kbu_tensors_file(300, 1u << 20, 0, 1);
	kb_register("warm_open/named/tensors:300/payload:1MiB", open_body, small);
	char *big = kbu_tensors_file(300, 1u << 20, smoke ? (64ull << 20) : (4ull << 30), 1);
	kb_register(smoke ? "warm_open/named/tensors:300/payload:64MiB"
			  : "warm_open/named/tensors:300/payload:4GiB",
		    open_body, big);
	return kb_main(argc, argv);
}
