/* SPDX-License-Identifier: MIT */
/*
 * Series: the one home of the STEM-NNNNN-of-MMMMM.EXT rule, for every format. Parsing and
 * formatting names (public: the converters and tools name shards with them), and resolving what
 * a caller gave into the files of a model: a series from any one of its shards, a list checked
 * to be one whole series, or a list of files that are no series, kept as given.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "net/net.h"
#include "model/series.h"

/* A run of exactly 5 decimal digits ending just before `end` (a sixth digit before it makes it
 * none): its value (0 when there is no such run); *start its first digit. */
static uint32_t digits_before(const char *s, const char *end, const char **start)
{
	const char *p = end;
	while (p > s && p[-1] >= '0' && p[-1] <= '9')
		p--;
	if (end - p != 5)
		return 0;
	uint32_t v = 0;
	for (const char *q = p; q < end; q++)
		v = v * 10 + (uint32_t)(*q - '0');
	*start = p;
	return v;
}

size_t kiln_series_parse(const char *path, uint32_t *no, uint32_t *total, const char **ext)
{
	if (!path)
		return 0;
	/* The extension: the last '.' after the last '/', with something after it. */
	const char *slash = strrchr(path, '/');
	const char *dot = strrchr(slash ? slash : path, '.');
	if (!dot || !dot[1])
		return 0;
	const char *a_start, *b_start;
	uint32_t b = digits_before(path, dot, &b_start);
	if (!b || b_start - path < 4 || memcmp(b_start - 4, "-of-", 4) != 0)
		return 0;
	uint32_t a = digits_before(path, b_start - 4, &a_start);
	if (!a || a > b || a_start - path < 2 || a_start[-1] != '-')
		return 0;
	if (no)
		*no = a;
	if (total)
		*total = b;
	if (ext)
		*ext = dot;
	return (size_t)(a_start - 1 - path);
}

size_t kiln_series_name(char *buf, size_t cap, const char *stem, size_t stem_len, uint32_t no,
			uint32_t total, const char *ext)
{
	if (!buf || !stem || !ext || no == 0 || no > total || total > 99999u)
		return 0;
	int n = snprintf(buf, cap, "%.*s-%05" PRIu32 "-of-%05" PRIu32 "%s", (int)stem_len, stem, no,
			 total, ext);
	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

char *kiln__series_path(const char *stem, size_t stem_len, uint32_t no, uint32_t total,
			const char *ext)
{
	size_t cap = stem_len + strlen(ext) + sizeof("-00000-of-00000");
	char *p = malloc(cap);
	if (p && !kiln_series_name(p, cap, stem, stem_len, no, total, ext)) {
		free(p);
		p = NULL;
	}
	return p;
}

static int nomem(kiln_error *err)
{
	return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
}

/* Whether two parsed names are of one series: the same stem, extension and total. */
static int same_series(const char *a, size_t astem, uint32_t atotal, const char *aext,
		       const char *b, size_t bstem, uint32_t btotal, const char *bext)
{
	return astem == bstem && memcmp(a, b, astem) == 0 && atotal == btotal &&
	       strcmp(aext, bext) == 0;
}

int kiln__series_check_alone(const char *stem, size_t stem_len, uint32_t total, const char *ext,
			     kiln_error *err)
{
	const char *slash = memrchr(stem, '/', stem_len);
	size_t dlen = slash ? (size_t)(slash - stem) + 1 : 0;
	char *dname = dlen ? strndup(stem, dlen) : strdup(".");
	if (!dname)
		return nomem(err);
	DIR *d = opendir(dname);
	free(dname);
	if (!d)
		return 0; /* every shard opened: a directory we cannot list hides nothing we use */
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d))) {
		char *full = NULL;
		if (asprintf(&full, "%.*s%s", (int)dlen, stem, e->d_name) < 0) {
			rc = nomem(err);
			break;
		}
		uint32_t no, tot;
		const char *x;
		size_t sl = kiln_series_parse(full, &no, &tot, &x);
		if (sl == stem_len && memcmp(full, stem, sl) == 0 && strcmp(x, ext) == 0 &&
		    tot != total)
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
					      "%s: another series of the same name (%" PRIu32
					      " shards) beside the %" PRIu32 "-shard one",
					      full, tot, total);
		free(full);
	}
	closedir(d);
	return rc;
}

void kiln__paths_free(char **p, uint32_t n)
{
	for (uint32_t i = 0; p && i < n; i++)
		free(p[i]);
	free(p);
}

/* Copies of the paths as given. */
static int copy_list(const char *const *paths, uint32_t count, char ***out, kiln_error *err)
{
	char **p = calloc(count, sizeof(*p));
	if (!p)
		return nomem(err);
	for (uint32_t i = 0; i < count; i++)
		if (!(p[i] = strdup(paths[i]))) {
			kiln__paths_free(p, i);
			return nomem(err);
		}
	*out = p;
	return 0;
}

int kiln__series_resolve(const char *const *paths, uint32_t count, int one_file, char ***out,
			 uint32_t *n, kiln_error *err)
{
	uint32_t no, total;
	const char *ext;
	size_t stem_len = kiln_series_parse(paths[0], &no, &total, &ext);
	/* A URL with a query (a presigned one) names one object: its siblings' queries differ. */
	if ((one_file && count == 1) || paths[0][kiln__url_path_len(paths[0])])
		stem_len = 0;
	if (!stem_len && count == 1) {
		*n = 1;
		return copy_list(paths, 1, out, err);
	}
	if (count > 1) {
		/* A list: either every name is a shard of one series, or none is. */
		uint32_t series = 0;
		for (uint32_t i = 0; i < count; i++)
			series += kiln_series_parse(paths[i], NULL, NULL, NULL) != 0;
		if (series == 0) {
			*n = count;
			return copy_list(paths, count, out, err);
		}
		if (series != count)
			return kiln__fail_inval(err, KILN_NO_INDEX, "path",
						"the files are not one series: some names are "
						"STEM-NNNNN-of-MMMMM.EXT and some are not");
		if (count != total)
			return kiln__fail_inval(err, KILN_NO_INDEX, "path",
						"%s is one of %" PRIu32 " shards but %" PRIu32
						" files were given",
						paths[0], total, count);
		uint8_t *seen = calloc((size_t)total + 1, 1);
		if (!seen)
			return nomem(err);
		for (uint32_t i = 0; i < count; i++) {
			uint32_t a, b;
			const char *x;
			size_t sl = kiln_series_parse(paths[i], &a, &b, &x);
			int rc = 0;
			if (!same_series(paths[i], sl, b, x, paths[0], stem_len, total, ext))
				rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
						      "%s is not a shard of the series of %s",
						      paths[i], paths[0]);
			else if (seen[a]++)
				rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
						      "shard %" PRIu32 " of %s is given twice", a,
						      paths[0]);
			if (rc) {
				free(seen);
				return rc;
			}
		}
		free(seen);
	}
	/* The whole series, in order, named from the stem; every shard must be there. */
	char **p = calloc(total, sizeof(*p));
	if (!p)
		return nomem(err);
	int rc = 0;
	for (uint32_t i = 0; i < total && !rc; i++)
		if (!(p[i] = kiln__series_path(paths[0], stem_len, i + 1, total, ext)))
			rc = nomem(err);
	if (!rc && !kiln__is_url(paths[0])) /* a URL's siblings cannot be listed */
		rc = kiln__series_check_alone(paths[0], stem_len, total, ext, err);
	if (rc) {
		kiln__paths_free(p, total);
		return rc;
	}
	*out = p;
	*n = total;
	return 0;
}
