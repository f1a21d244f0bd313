/* SPDX-License-Identifier: MIT */
/*
 * Warm open: kiln_dir_open + structural validation + close, on files in the page cache.
 * - by tensor count (1 .. 300,000, tiny payloads): cost should grow linearly with the count;
 * - 300 tensors with 1 MiB vs 4 GiB of payload: cost should not depend on the payload, since
 *   open reads only the directory. The 4 GiB file is sparse (its payload is a hole), which is
 *   fair because open never reads payload pages (tests/test_open.c proves that with mincore).
 * Files go to $KILN_BENCH_DIR (default ./bench-files) and are removed at exit.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "shim.h"

static void open_body(kb_state *st, uint64_t iters, void *arg)
{
	const char *path = arg;
	for (uint64_t i = 0; i < iters; i++) {
		kiln_dir *dir;
		kiln_error err;
		if (kiln_dir_open(path, NULL, &dir, &err) != 0) {
			kb_skip(st, err.message);
			return;
		}
		kiln_dir_close(dir);
	}
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
	}
	/* Named: each name is hashed and checked for duplicates. The heap's u16 offsets cap how
	 * many names fit (about 7,000 of this length). */
	static const uint32_t named[] = {1, 300, 3000};
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		char *path = kbu_tensors_file(named[i], 16, 0, 1);
		snprintf(name, sizeof(name), "warm_open/named/tensors:%u", named[i]);
		kb_register(name, open_body, path);
	}
	/* Same tensor count, payload 1 MiB vs 4 GiB (sparse). */
	char *small = kbu_tensors_file(300, 1u << 20, 0, 1);
	kb_register("warm_open/named/tensors:300/payload:1MiB", open_body, small);
	char *big = kbu_tensors_file(300, 1u << 20, smoke ? (64ull << 20) : (4ull << 30), 1);
	kb_register(smoke ? "warm_open/named/tensors:300/payload:64MiB"
			  : "warm_open/named/tensors:300/payload:4GiB",
		    open_body, big);
	return kb_main(argc, argv);
}
