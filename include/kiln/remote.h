/* SPDX-License-Identifier: MIT */
/* kiln/remote.h: models behind URLs (included by kiln/kiln.h); docs/remote.md has the rest. */
#ifndef KILN_REMOTE_H
#define KILN_REMOTE_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * URLs. Wherever a path is taken, a URL may stand: s3://BUCKET/KEY, http://... or https://...
 * The first ranged GET pins the object's size and ETag; the header and directory are validated
 * as a local file's are; every later GET sends If-Match with the pinned ETag, so an object that
 * changed is IO (ESTALE), never a mix of two versions. The payload is fetched into owned memory
 * (or the load buffer), or with KILN_OPEN_DIRECTORY_ONLY only as tensors are read. A series or
 * an index at a URL opens its shards beside it; a URL with a query (presigned) is one file.
 * Errors are IO naming the URL (its query left out), the byte range and the HTTP status with
 * the S3 error code; sys_errno is EACCES for 401/403, ENOENT for 404, ESTALE for a changed
 * object, ETIMEDOUT past the deadline, ECONNREFUSED, else EIO. Credentials, regions, endpoints
 * and CA bundles are read as the AWS tools read them (HF_TOKEN goes to huggingface.co and hf.co
 * only): docs/remote.md has the order, the retries and the cache.
 */
typedef struct kiln_remote_options {
	uint32_t size;        /* 0 or sizeof(kiln_remote_options) */
	uint32_t connections; /* ranged GETs in flight per file; 0 means 8, at most 64 */
	uint32_t chunk_size;  /* payload bytes per GET; 0 means 8 MiB; 64 KiB to 1 GiB */
	/* Attempts after the first for one range; 0 means 6, KILN_REMOTE_NO_RETRY none. The
	 * waits grow from 200 ms, doubling, to 10 s, each between half and all of its step. */
	uint32_t retries;
	/* A transfer that receives nothing for this long is retried; 0: 30 s. */
	uint32_t stall_ms;
	uint32_t reserved32;
	/* Each operation (opening one file, fetching its payload, one read) fails with
	 * IO/ETIMEDOUT once it has run this long, retries included; 0: no deadline. */
	uint64_t deadline_ms;
	uint64_t max_bytes_per_sec; /* bandwidth cap per file, all its connections; 0: none */
	const char *ca_bundle;      /* see above; NULL: from the environment */
	const char *endpoint;       /* s3://: overrides the environment's endpoint */
	const char *region;         /* s3://: overrides the environment's region */
	const char *profile;        /* s3://: overrides AWS_PROFILE */
	/* Called from the opening thread as payload bytes arrive (done of total, for one file);
	 * a nonzero return stops the fetch: CANCELED. NULL: none. */
	int (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	/* A local cache of whole objects, one file per object version (URL and ETag), written
	 * through as the payload arrives and published atomically; a later open of a version
	 * there opens the cached file with the local source the options ask for (MMAP: a
	 * mapping). NULL: KILN_CACHE_DIR; no cache when neither is set (or ""). It must be a
	 * private store: a directory of the effective user's that no one else may write (made
	 * 0700 when missing), else it is not used (kiln_cache_check). Objects without an ETag
	 * and directory-only opens are not cached; a cache that cannot be used is skipped, the
	 * open does not fail for it. */
	const char *cache_dir;
	/* Bytes the cache may hold; past it the least recently used files go. 0:
	 * KILN_CACHE_MAX_BYTES, else no cap. */
	uint64_t cache_max_bytes;
	/* A cached version used or confirmed within this many milliseconds is opened without
	 * asking the server (no round trip at all); older ones are confirmed with the first GET
	 * (its ETag and size). 0: KILN_CACHE_MAX_AGE_MS, else always confirm. */
	uint64_t cache_max_age_ms;
	/* Each request for n bytes may take stall_ms + n / min_bytes_per_sec at the most, then it
	 * is retried (a server that drips a few bytes a second never stalls): 0 means 64 KiB/s. */
	uint64_t min_bytes_per_sec;
	uint64_t reserved[3]; /* zero */
} kiln_remote_options;

#define KILN_REMOTE_NO_RETRY UINT32_MAX

/* Nonzero when `path` is a URL kiln fetches (s3://, http://, https://), 0 for a local path. */
KILN_API int kiln_path_is_url(const char *path);

/* `path` as kiln's own messages show it, into buf[0, cap) (NUL-terminated, cut to fit): a URL
 * with its credentials left out (a password before the host as "***@", the query, which holds
 * a presigned URL's signature, as "?..."), a local path as it is. Returns the length written.
 * For a program's own messages about a model it opened. */
KILN_API size_t kiln_path_shown(const char *path, char *buf, size_t cap);

/* Whether the cache `o` asks for (o->cache_dir, else KILN_CACHE_DIR) would be used: 0 when it is
 * a private store (a directory owned by the effective user that no one else may write) or not
 * made yet, or when no cache is asked for; else IO naming the directory and why (sys_errno
 * EPERM, or the errno of opening it). A URL's open goes on uncached and says so in
 * kiln_model_info.cache_refused; this gives the words for it. */
KILN_API int kiln_cache_check(const kiln_remote_options *o, kiln_error *err);

/* Takes `len` bytes of a fetch as they arrive; nonzero stops it (CANCELED). */
typedef int (*kiln_fetch_fn)(void *ctx, const void *data, size_t len);
#define KILN_FETCH_TO_END UINT64_MAX
/*
 * Bytes [offset, offset + length) of the object at `url` (length KILN_FETCH_TO_END: to its end)
 * handed to `sink` in order, with one GET over one connection, the credentials, endpoints,
 * retries (resumed from the last byte received, If-Match the ETag of the first answer),
 * deadline, bandwidth cap and progress of `o` (NULL: defaults). For the files that travel with
 * weights (config.json, a tokenizer), and klnt bench's plain baseline. *size, when not NULL, is
 * the object's size. INVAL (not a URL, no sink, an empty or overflowing range), IO naming the
 * URL, range and HTTP status (an offset past the end is HTTP 416), CANCELED.
 */
KILN_API int kiln_remote_fetch(const char *url, const kiln_remote_options *o, uint64_t offset,
			       uint64_t length, kiln_fetch_fn sink, void *ctx, uint64_t *size,
			       kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KILN_REMOTE_H */
