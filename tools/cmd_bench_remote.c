/* SPDX-License-Identifier: MIT */
/* klnt bench on URLs: loads of remote files next to one plain GET of the same objects, rounds
 * interleaved in a new random order each time, so a slow moment of the server or the network
 * hits every row. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "klnt.h"
#include "measure.h"

enum row { R_CURL, R_BYTE, R_OPEN, R_LOAD, R_LOAD1, NROW };

static const char *const row_name[] = {"curl", "first-byte", "open", "load", "load-1"};
_Static_assert(sizeof(row_name) / sizeof(row_name[0]) == NROW, "one name per row");

struct rbench {
	const char *const *urls;
	uint32_t n;
	uint32_t connections; /* the load row's; 0: kiln's default */
	uint64_t got;         /* bytes the plain rows received, checked against the size */
};

static int null_sink(void *ctx, const void *data, size_t len)
{
	(void)data;
	*(uint64_t *)ctx += len;
	return 0;
}

/* One timed run of row r; seconds, or a negative value with the error reported. */
static double run_row(struct rbench *b, enum row r)
{
	kiln_error err;
	kiln_remote_options ro =
	    klnt_remote() ? *klnt_remote() : (kiln_remote_options){.size = sizeof(ro)};
	ro.connections = r == R_LOAD1 ? 1 : b->connections;
	double t0 = kmeasure_now();
	if (r == R_CURL || r == R_BYTE) {
		for (uint32_t i = 0; i < b->n; i++) {
			uint64_t size = 0, before = b->got;
			int rc = kiln_remote_fetch(b->urls[i], &ro, 0,
						   r == R_CURL ? KILN_FETCH_TO_END : 1, null_sink,
						   &b->got, &size, &err);
			if (!rc && b->got - before != (r == R_CURL ? size : size != 0))
				rc = kiln_error_set(&err, KILN_IO, 0,
						    "%" PRIu64 " bytes came of %" PRIu64,
						    b->got - before, size);
			if (rc) {
				klnt_report(stderr, b->urls[i], rc, &err);
				return -1;
			}
		}
		return kmeasure_now() - t0;
	}
	kiln_open_options o = {.size = sizeof(o), .remote = &ro};
	if (r == R_OPEN)
		o.flags = KILN_OPEN_DIRECTORY_ONLY;
	kiln_model *m;
	int rc = kiln_model_open_files(b->urls, b->n, &o, &m, &err);
	if (rc) {
		klnt_report(stderr, b->urls[0], rc, &err);
		return -1;
	}
	kiln_model_close(m);
	return kmeasure_now() - t0;
}

static uint64_t next_random(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

int klnt_bench_remote(const char *const *urls, uint32_t n, uint64_t repeat, uint32_t connections)
{
	/* The directory of every file once, so a bad URL gets one clear line; a series name brings
	 * its siblings, whose URLs the rows then use. */
	kiln_open_options vo = {
	    .size = sizeof(vo), .flags = KILN_OPEN_DIRECTORY_ONLY, .remote = klnt_remote()};
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open_files(urls, n, &vo, &m, &err);
	if (rc) {
		klnt_report(stderr, urls[0], rc, &err);
		return klnt_exit_for(rc);
	}
	struct rbench b = {.n = kiln_model_files(m), .connections = connections};
	char **own = klnt_xmalloc(b.n * sizeof(char *));
	uint64_t total = 0, tensors = kiln_model_count(m);
	for (uint32_t i = 0; i < b.n; i++) {
		kiln_file_info info;
		kiln_model_file_info(m, i, &info);
		own[i] = strdup(info.path);
		total += info.size;
	}
	kiln_model_close(m);
	b.urls = (const char *const *)own;

	double *t[NROW], *ratio = klnt_xmalloc(repeat * sizeof(double));
	for (int r = 0; r < NROW; r++)
		t[r] = klnt_xmalloc(repeat * sizeof(double));
	int live[NROW], tty = isatty(STDERR_FILENO), failed = 0;
	for (int r = 0; r < NROW; r++)
		live[r] = 1;
	uint64_t rnd = 0x9e3779b97f4a7c15ull;
	/* One untimed round first: name lookups, TLS sessions and the server's own caches. */
	for (uint64_t round = 0; round <= repeat; round++) {
		enum row order[NROW];
		for (int r = 0; r < NROW; r++)
			order[r] = (enum row)r;
		for (int r = NROW - 1; r > 0; r--) {
			int k = (int)(next_random(&rnd) % (uint64_t)(r + 1));
			enum row x = order[r];
			order[r] = order[k];
			order[k] = x;
		}
		for (int oi = 0; oi < NROW; oi++) {
			enum row r = order[oi];
			if (!live[r])
				continue;
			if (tty)
				fprintf(stderr,
					"\rklnt bench: round %" PRIu64 "/%" PRIu64 " %-10s   ",
					round, repeat, row_name[r]);
			double dt = run_row(&b, r);
			if (dt < 0) {
				live[r] = 0, failed = 1;
				continue;
			}
			if (round > 0)
				t[r][round - 1] = dt;
		}
	}
	if (tty)
		fprintf(stderr, "\r%60s\r", "");

	char shown[4096]; /* the URL without its credentials */
	kiln_path_shown(b.urls[0], shown, sizeof(shown));
	if (b.n == 1)
		printf("url %s: %" PRIu64 " tensors, %" PRIu64 " bytes, %" PRIu64 " rounds\n\n",
		       shown, tensors, total, repeat);
	else
		printf("set of %" PRIu32 " urls (%s, ...): %" PRIu64 " tensors, %" PRIu64
		       " bytes, %" PRIu64 " rounds\n\n",
		       b.n, shown, tensors, total, repeat);
	printf("%-6s  %-10s  %10s  %10s  %10s  %8s  %9s\n", "mode", "source", "median ms", "min ms",
	       "max ms", "GB/s", "vs curl");
	double med[NROW] = {0}, open_rt = 0;
	if (live[R_OPEN] && live[R_BYTE]) {
		for (uint64_t i = 0; i < repeat; i++)
			ratio[i] = t[R_OPEN][i] / t[R_BYTE][i];
		open_rt = kmeasure_median(ratio, repeat);
	}
	for (int r = 0; r < NROW; r++) {
		if (!live[r])
			continue;
		double rat = 0;
		if (live[R_CURL]) {
			for (uint64_t i = 0; i < repeat; i++)
				ratio[i] = t[R_CURL][i] / t[r][i];
			rat = kmeasure_median(ratio, repeat);
		}
		med[r] = kmeasure_median(t[r], repeat); /* sorts: ratios first */
		printf("%-6s  %-10s  %10.3f  %10.3f  %10.3f  ", "remote", row_name[r], med[r] * 1e3,
		       t[r][0] * 1e3, t[r][repeat - 1] * 1e3);
		if (r == R_OPEN || r == R_BYTE || !live[R_CURL])
			printf("%8s  %9s\n", "-", "-");
		else
			printf("%8.2f  %8.2fx\n", (double)total / 1e9 / med[r], rat);
	}
	printf(
	    "\nvs curl: the median over rounds of curl's time over the row's, both from the same "
	    "round\n");
	if (open_rt > 0)
		printf("open: %.2fx the time of first-byte (one GET of one byte: a round trip) per "
		       "file\n",
		       open_rt);
	for (int r = 0; r < NROW; r++)
		free(t[r]);
	free(ratio);
	for (uint32_t i = 0; i < b.n; i++)
		free(own[i]);
	free(own);
	int e = klnt_flush_stdout();
	return e || failed ? KLNT_EXIT_IO : KLNT_EXIT_OK;
}
