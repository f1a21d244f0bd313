/* SPDX-License-Identifier: MIT */
/* The local cache of remote files (src/source/cache.c), used by the REMOTE source. */
#ifndef KILN_SOURCE_CACHE_H
#define KILN_SOURCE_CACHE_H

#include "base/base.h"

struct kiln__cache {
	const char *dir; /* NULL: no cache */
	uint64_t max_bytes, max_age_ms;
	int fd; /* the directory, open and found private; -1 */
	/* errno why a directory that is there is not used (EPERM: not private), or 0 */
	int refused;
	const char *bad_env; /* a KILN_CACHE_* number that is none: no cache rather than a guess */
};

/* An entry's name: URLHASH-VERSIONHASH.EXT, at most this long with its NUL. */
#define KILN__CACHE_NAME_MAX 64

/* The cache the options and the environment ask for (not opened); returns whether there is one. */
int kiln__cache_settings(const kiln_remote_options *o, struct kiln__cache *c);
/* Open the directory, made (0700, as `mkdir -p`) when `create`, and check that it is a private
 * store: owned by the effective user, writable by no one else. 0; else IO naming the directory
 * and why, its errno also in c->refused unless the directory is not there (ENOENT). */
int kiln__cache_open(struct kiln__cache *c, int create, kiln_error *err);
void kiln__cache_close(struct kiln__cache *c);
/* The name of the version (etag, size) of `url`. */
void kiln__cache_name(const char *url, const char *etag, uint64_t size,
		      char out[KILN__CACHE_NAME_MAX]);
/* Whether a name found in the directory is an entry (URLHASH-VERSIONHASH.EXT: lowercase hex,
 * an extension, no '/', shorter than KILN__CACHE_NAME_MAX); only those are evicted. */
int kiln__cache_is_entry(const char *name);
/* The name of the link to the newest version beside entry `entry` (one kiln__cache_is_entry
 * accepts): URLHASH.EXT. */
void kiln__cache_link_name(const char *entry, char out[KILN__CACHE_NAME_MAX]);
/* The newest cached version of `url` in the open cache (malloc'ed: the path of the URL's link to
 * it, for messages), or NULL. *fresh when it was used or confirmed within max_age_ms: then it may
 * be opened without asking the server, it is marked used (to the minute), and *fd is its open
 * descriptor and *size its size (for the local source to take over; else *fd is -1). */
char *kiln__cache_lookup(const struct kiln__cache *c, const char *url, int *fresh, int *fd,
			 uint64_t *size);
/* The open descriptor of entry `name` when it holds `size` bytes (the version the server has just
 * confirmed), marked used; else -1. */
int kiln__cache_hit(const struct kiln__cache *c, const char *name, uint64_t size);
/* dir/name, for messages and the local source (malloc'ed; NULL: no memory). */
char *kiln__cache_path(const struct kiln__cache *c, const char *name);
/* Whether an object of `len` bytes would be kept (not larger than max_bytes). */
int kiln__cache_fits(const struct kiln__cache *c, uint64_t len);
/* Publish `len` bytes as entry `name` atomically, with what the server has beside that version:
 * its digest sidecar (sidecar_len bytes, kept as name + KILN__SIDECAR_SUFFIX, published first)
 * or, when `sidecar` is NULL, none (a stale one removed). Then evict to max_bytes, counting
 * each sidecar with its entry. Nothing when the object does not fit. */
int kiln__cache_store(struct kiln__cache *c, const char *name, const uint8_t *bytes, uint64_t len,
		      const uint8_t *sidecar, size_t sidecar_len, kiln_error *err);
/* The path of the version entry that is the same file as `fd`, a copy opened through the URL's
 * link `link` (dir/URLHASH.EXT, which names no version): found by its inode in a scan of the
 * directory, checked as kiln__cache_open checks it. Made only when something asks for the
 * version (its sidecar). malloc'ed; NULL with errno: ENOENT when no entry is that file (evicted
 * since), ENOMEM, or why the directory could not be opened or read. */
char *kiln__cache_version_path(const char *link, int fd);
/* The open descriptor of the sidecar at `path` (an entry's path + KILN__SIDECAR_SUFFIX), served
 * as entries are (a regular file of the user's, writable by no one else, reached without
 * following a symlink), and its size; -1 with errno: ENOENT when there is none, ELOOP for a
 * symlink, EINVAL not a regular file, EPERM. */
int kiln__cache_open_sidecar(const char *path, uint64_t *size);

#endif
