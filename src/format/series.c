/* SPDX-License-Identifier: MIT */
/*
 * Series: the one home of the STEM-NNNNN-of-MMMMM.EXT rule, for every format: parsing and
 * formatting names (public: the converters and tools name shards with them). The resolver
 * (src/model/resolve.c) finds a model's series with them, GGUF's reader checks a split file's
 * name, the KLNT series writer names its shards.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "format/series.h"

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
	if (!buf || !stem || !ext || no == 0 || no > total || total > KILN__SERIES_MAX)
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
