/* SPDX-License-Identifier: MIT */
/* The local cache of remote files (src/cache.c), used by the REMOTE source. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include "internal.h"

struct kiln__cache {
	const char *dir; /* NULL: no cache */
	uint64_t max_bytes, max_age_ms;
};

/* The cache the options and the environment ask for; returns whether there is one. */
int kiln__cache_settings(const kiln_remote_options *o, struct kiln__cache *c);
/* Where the version (etag, size) of `url` is cached (malloc'ed; NULL: no memory). */
char *kiln__cache_path(const struct kiln__cache *c, const char *url, const char *etag,
		       uint64_t size);
/* A version of `url` used or confirmed within max_age_ms (the newest), or NULL. */
char *kiln__cache_fresh(const struct kiln__cache *c, const char *url);
/* Whether some version of `url` is cached. */
int kiln__cache_has(const struct kiln__cache *c, const char *url);
/* Whether `path` is a cached file of `size` bytes; touches it when it is. */
int kiln__cache_hit(const char *path, uint64_t size);
/* Mark `path` used now; `confirmed`: the server has just said it is current. */
void kiln__cache_touch(const char *path, int confirmed);
/* Publish `len` bytes as `path` atomically, then evict to max_bytes. */
int kiln__cache_store(const struct kiln__cache *c, const char *path, const uint8_t *bytes,
		      uint64_t len, kiln_error *err);

#endif
