/* SPDX-License-Identifier: MIT */
/*
 * The kiln side of bench/remote.sh: time one operation on a URL (or a path), once, and print
 * the seconds. The script runs it beside curl and boto3, round after round, and takes medians.
 *
 *   remote_load load URL        open with the payload fetched into memory (every byte)
 *   remote_load open URL        KILN_OPEN_DIRECTORY_ONLY: the header and directory alone
 *   remote_load map PATH|URL    the default open (a URL through KILN_CACHE_DIR: the cached copy)
 *   remote_load map-pair URL PATH  in one process, 101 rounds of one open of each (URL through
 *                               the cache, then its cached file), the first untimed: both medians
 *                               and the median of the rounds' ratios (a runtime's steady state,
 *                               without the first touches of the library's code)
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

static double open_once(const char *path)
{
	kiln_model *m;
	kiln_error err;
	double t0 = now();
	int rc = kiln_model_open(path, NULL, &m, &err);
	double t = now() - t0;
	if (rc) {
		fprintf(stderr, "%s: %s: %s\n", path, kiln_code_name(rc), err.message);
		exit(1);
	}
	kiln_model_close(m);
	return t;
}

#define PAIRS 100

static int pair(const char *url, const char *path)
{
	static double a[PAIRS], b[PAIRS], r[PAIRS];
	open_once(url);
	open_once(path);
	for (int i = 0; i < PAIRS; i++) {
		a[i] = open_once(url);
		b[i] = open_once(path);
		r[i] = a[i] / b[i];
	}
	qsort(a, PAIRS, sizeof(double), cmp_double);
	qsort(b, PAIRS, sizeof(double), cmp_double);
	qsort(r, PAIRS, sizeof(double), cmp_double);
	printf("%.6f %.6f %.4f\n", a[PAIRS / 2], b[PAIRS / 2], r[PAIRS / 2]);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "map-pair"))
		return pair(argv[2], argv[3]);
	if (argc != 3) {
		fprintf(stderr, "usage: remote_load load|open|map URL | map-pair URL PATH\n");
		return 2;
	}
	kiln_open_options o = {.size = sizeof(o)};
	if (!strcmp(argv[1], "open"))
		o.flags = KILN_OPEN_DIRECTORY_ONLY;
	/* libcurl (OpenSSL) initialized before the clock starts, as a runtime that has opened a URL
	 * before has it, and as curl's own time_total leaves it out. */
	curl_global_init(CURL_GLOBAL_DEFAULT);
	kiln_model *m;
	kiln_error err;
	double t0 = now();
	int rc = kiln_model_open(argv[2], &o, &m, &err);
	double t1 = now();
	if (rc) {
		fprintf(stderr, "%s: %s: %s\n", argv[2], kiln_code_name(rc), err.message);
		return 1;
	}
	kiln_model_close(m);
	printf("%.6f\n", t1 - t0);
	return 0;
}
