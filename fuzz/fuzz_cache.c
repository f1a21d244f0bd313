/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: cache entry names. A cache directory is read back by name (kiln__cache_is_entry
 * decides what eviction may remove, and kiln__cache_link_name derives the link beside it), and
 * names are made from what servers and indexes choose (a URL, an ETag, a size). The input is a
 * URL, a NUL, an ETag, a NUL and a size (8 bytes, little-endian), else the whole input is a name
 * found in the directory.
 *
 * Judged: a name kiln makes is one it accepts back, has no '/' and fits; its link name is the
 * same for every version of the URL and no entry's; a name it accepts from the directory yields
 * a link name of lowercase hex and an extension, with no '/', and the link name of one it
 * made is its own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "fuzz.h"
#include "source/cache.h"

static void check_link(const char *entry)
{
	char lnk[KILN__CACHE_NAME_MAX];
	memset(lnk, 0, sizeof(lnk));
	kiln__cache_link_name(entry, lnk);
	size_t n = strnlen(lnk, sizeof(lnk));
	FUZZ_CHECK(n < sizeof(lnk) && n >= 33, "link of %s: %zu bytes", entry, n);
	FUZZ_CHECK(!strchr(lnk, '/'), "link of %s: %s has a '/'", entry, lnk);
	for (size_t i = 0; i < 32; i++)
		FUZZ_CHECK(strchr("0123456789abcdef", lnk[i]) && lnk[i], "link %s: not hex", lnk);
	FUZZ_CHECK(lnk[32] == '.', "link %s: no extension", lnk);
	FUZZ_CHECK(!kiln__cache_is_entry(lnk), "link %s passes for an entry", lnk);
}

int kiln_fuzz_cache(const uint8_t *data, size_t size)
{
	const uint8_t *z1 = memchr(data, 0, size);
	const uint8_t *z2 = z1 ? memchr(z1 + 1, 0, size - (size_t)(z1 + 1 - data)) : NULL;
	if (!z2 || size - (size_t)(z2 + 1 - data) != 8) {
		char *name = kiln__fuzz_cstr(data, size);
		if (!name)
			return 0;
		if (kiln__cache_is_entry(name))
			check_link(name);
		free(name);
		return 0;
	}
	const char *url = (const char *)data, *etag = (const char *)z1 + 1;
	uint64_t sz;
	memcpy(&sz, z2 + 1, 8);
	char a[KILN__CACHE_NAME_MAX], b[KILN__CACHE_NAME_MAX];
	kiln__cache_name(url, etag, sz, a);
	FUZZ_CHECK(kiln__cache_is_entry(a), "made %s, which is no entry", a);
	check_link(a);
	kiln__cache_name(url, "another version", sz + 1, b);
	char la[KILN__CACHE_NAME_MAX], lb[KILN__CACHE_NAME_MAX];
	kiln__cache_link_name(a, la);
	kiln__cache_link_name(b, lb);
	FUZZ_CHECK(!strcmp(la, lb), "two versions of one URL, two links: %s %s", la, lb);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_cache(data, size);
}
#endif
