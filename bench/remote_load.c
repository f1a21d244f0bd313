/* SPDX-License-Identifier: MIT */
/*
 * The kiln side of bench/remote.sh: time one operation on a URL (or a path), once, and print
 * the seconds. The script runs it beside curl and boto3, round after round, and takes medians.
 *
 *   remote_load load URL        open with the payload fetched into memory (every byte)
 *   remote_load open URL        KILN_OPEN_DIRECTORY_ONLY: the header and directory alone
 *   remote_load map PATH|URL    the default open (a URL through KILN_CACHE_DIR: the cached copy)
 *   remote_load map-warm PATH|URL  the same in a process that has opened it once: the median of
 *                               15 opens after an untimed one (a runtime's steady state, without
 *                               the first touches of the library's code)
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: remote_load load|open|map|map-warm URL\n");
		return 2;
	}
	kiln_open_options o = {.size = sizeof(o)};
	if (!strcmp(argv[1], "open"))
		o.flags = KILN_OPEN_DIRECTORY_ONLY;
	/* libcurl (OpenSSL) initialized before the clock starts, as a runtime that has opened a URL
	 * before has it, and as curl's own time_total leaves it out. */
	curl_global_init(CURL_GLOBAL_DEFAULT);
	int warm = !strcmp(argv[1], "map-warm"), runs = warm ? 16 : 1;
	double t[16];
	for (int i = 0; i < runs; i++) {
		kiln_model *m;
		kiln_error err;
		double t0 = now();
		int rc = kiln_model_open(argv[2], &o, &m, &err);
		t[i] = now() - t0;
		if (rc) {
			fprintf(stderr, "%s: %s: %s\n", argv[2], kiln_code_name(rc), err.message);
			return 1;
		}
		kiln_model_close(m);
	}
	if (warm) { /* t[0] was the untimed first open */
		qsort(t + 1, 15, sizeof(double), cmp_double);
		t[0] = t[8];
	}
	printf("%.6f\n", t[0]);
	return 0;
}
