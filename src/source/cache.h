/* SPDX-License-Identifier: MIT */
/* The local cache of remote files (src/source/cache.c), used by the REMOTE source. */
#ifndef KILN_SOURCE_CACHE_H
#define KILN_SOURCE_CACHE_H

#include "base/base.h"

struct kiln__cache {
	const char *dir; /* NULL: no cache */
	uint64_t max_bytes, max_age_ms;
};

/* The cache the options and the environment ask for; returns whether there is one. */
int kiln__cache_settings(const kiln_remote_options *o, struct kiln__cache *c);
/* Where the version (etag, size) of `url` is cached (malloc'ed; NULL: no memory). */
char *kiln__cache_path(const struct kiln__cache *c, const char *url, const char *etag,
		       uint64_t size);
/* The newest cached version of `url` (malloc'ed: the path of the URL's link to it), or NULL. *fresh
 * when it was used or confirmed within max_age_ms: then it may be opened without asking the server,
 * it is marked used (to the minute), and *fd is its open descriptor and *size its size (for the
 * local source to take over; else *fd is -1). */
char *kiln__cache_lookup(const struct kiln__cache *c, const char *url, int *fresh, int *fd,
			 uint64_t *size);
/* Whether `path` is a cached file of `size` bytes (the version the server has just confirmed);
 * marks it used when it is. */
int kiln__cache_hit(const char *path, uint64_t size);
/* Publish `len` bytes as `path` atomically, then evict to max_bytes. */
int kiln__cache_store(const struct kiln__cache *c, const char *path, const uint8_t *bytes,
		      uint64_t len, kiln_error *err);

#endif
