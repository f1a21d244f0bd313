/* SPDX-License-Identifier: MIT */
/*
 * The local cache of remote files (kiln_remote_options.cache_dir, KILN_CACHE_DIR): one file per
 * object version, named URLHASH-VERSIONHASH.EXT, where URLHASH is XXH3-128 of the URL without its
 * query (a presigned URL's signature changes, the object does not) and VERSIONHASH XXH3-64 of its
 * ETag and size. Written whole with kiln_write_atomic (no name until complete, nothing left by a
 * crash), so whatever has a cache name is a whole object. Beside it, URLHASH.EXT is a second
 * (hard) link to the newest version: a fresh hit opens a name known from the URL, no scan of the
 * directory and no symbolic link to follow. A file's modification time is when it was last used or
 * confirmed current: eviction removes the oldest first, and an entry younger than the max age is
 * used without asking the server.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/publish.h"
#include "source/cache.h"
#include "base/sys.h"
#include "net/url.h"

#define URLHASH_LEN 32

int kiln__cache_settings(const kiln_remote_options *o, struct kiln__cache *c)
{
	memset(c, 0, sizeof(*c));
	c->dir = o && o->cache_dir ? o->cache_dir : kiln__env("KILN_CACHE_DIR");
	if (c->dir && !*c->dir)
		c->dir = NULL;
	const char *v;
	c->max_bytes = o && o->cache_max_bytes                   ? o->cache_max_bytes
		       : (v = kiln__env("KILN_CACHE_MAX_BYTES")) ? strtoull(v, NULL, 10)
								 : 0;
	c->max_age_ms = o && o->cache_max_age_ms                   ? o->cache_max_age_ms
			: (v = kiln__env("KILN_CACHE_MAX_AGE_MS")) ? strtoull(v, NULL, 10)
								   : 0;
	return c->dir != NULL;
}

/* The extension a cache file keeps, so that the readers' by-name rules still apply. */
static const char *ext_of(const char *url, size_t n)
{
	static const char *const known[] = {".safetensors", ".gguf", ".klnt", ".json"};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		size_t k = strlen(known[i]);
		if (n > k && !memcmp(url + n - k, known[i], k))
			return known[i];
	}
	return ".bin";
}

static void url_hash(const char *url, char out[URLHASH_LEN + 1], const char **ext)
{
	size_t n = kiln__url_name_len(url);
	XXH128_hash_t h = XXH3_128bits(url, n);
	snprintf(out, URLHASH_LEN + 1, "%016" PRIx64 "%016" PRIx64, (uint64_t)h.high64,
		 (uint64_t)h.low64);
	*ext = ext_of(url, n);
}

char *kiln__cache_path(const struct kiln__cache *c, const char *url, const char *etag,
		       uint64_t size)
{
	char uh[URLHASH_LEN + 1];
	const char *ext;
	url_hash(url, uh, &ext);
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, etag, strlen(etag) + 1);
	XXH3_64bits_update(&st, &size, sizeof(size));
	char *p = NULL;
	if (asprintf(&p, "%s/%s-%016" PRIx64 "%s", c->dir, uh, (uint64_t)XXH3_64bits_digest(&st),
		     ext) < 0)
		return NULL;
	return p;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t mtime_ms(const struct stat *st)
{
	return (uint64_t)st->st_mtim.tv_sec * 1000u + (uint64_t)st->st_mtim.tv_nsec / 1000000u;
}

/* Whether a directory entry is a cache file (URLHASH-VERSIONHASH.EXT). */
static int is_entry(const char *name)
{
	size_t n = strlen(name);
	if (n < URLHASH_LEN + 18 || name[URLHASH_LEN] != '-')
		return 0;
	for (size_t i = 0; i < URLHASH_LEN + 17; i++)
		if (i != URLHASH_LEN && !strchr("0123456789abcdef", name[i]))
			return 0;
	return name[URLHASH_LEN + 17] == '.';
}

/* dir/URLHASH.EXT: the link to the newest version of `url`. */
static char *link_path(const struct kiln__cache *c, const char *url)
{
	char uh[URLHASH_LEN + 1];
	const char *ext;
	url_hash(url, uh, &ext);
	char *p = NULL;
	return asprintf(&p, "%s/%s%s", c->dir, uh, ext) < 0 ? NULL : p;
}

char *kiln__cache_lookup(const struct kiln__cache *c, const char *url, int *fresh, int *fd,
			 uint64_t *size)
{
	*fresh = 0;
	*fd = -1;
	char *p = link_path(c, url);
	/* Opened, not stat'ed: a fresh copy's descriptor is the one the local source maps, so a
	 * fresh hit costs no system call a local open does not make. */
	int d = p ? open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY) : -1;
	struct stat st; /* of the version the link names */
	if (d < 0 || fstat(d, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > SIZE_MAX) {
		if (d >= 0)
			close(d);
		free(p);
		return NULL;
	}
	uint64_t t = mtime_ms(&st), now = now_ms();
	if (!c->max_age_ms || t + c->max_age_ms < now) {
		close(d); /* to be confirmed by the server first */
		return p;
	}
	*fresh = 1;
	/* Used now: last to be evicted. To the minute: a metadata write per open would cost a
	 * fresh hit a third of the local open it is. */
	if (t + 60000 < now)
		(void)futimens(d, NULL);
	fcntl(d, F_SETFL, 0); /* O_NONBLOCK was for a FIFO in its place */
	*fd = d;
	*size = (uint64_t)st.st_size;
	return p;
}

int kiln__cache_hit(const char *path, uint64_t size)
{
	struct stat st;
	if (stat(path, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size)
		return 0;
	(void)utimensat(AT_FDCWD, path, NULL, 0); /* confirmed now: last to be evicted */
	return 1;
}

struct fill {
	const uint8_t *bytes;
	uint64_t len;
};

static int fill_file(void *ctx, int fd, kiln_error *err)
{
	const struct fill *f = ctx;
	int e = kiln__write_all(fd, f->bytes, (size_t)f->len);
	return e ? kiln__fail_sys(err, KILN_IO, e, "cannot write: %s", strerror(e)) : 0;
}

/* The link beside the version at `path` (dir/URLHASH-VERSION.EXT): dir/URLHASH.EXT. */
static char *link_of(const char *path)
{
	const char *base = strrchr(path, '/') + 1;
	char *lnk = NULL;
	if (asprintf(&lnk, "%.*s%.*s%s", (int)(base - path), path, URLHASH_LEN, base,
		     base + URLHASH_LEN + 17) < 0)
		return NULL;
	return lnk;
}

/* Make URLHASH.EXT name the version at `path`. Between the unlink and the link a reader finds
 * no name and asks the server, which names this version: a round trip, never a wrong file. */
static int point_link(const char *path, kiln_error *err)
{
	char *lnk = link_of(path);
	if (!lnk)
		return kiln__nomem(err, 0, NULL);
	int rc = 0;
	(void)unlink(lnk);
	if (link(path, lnk) && errno != EEXIST) /* EEXIST: another writer */
		rc = kiln__fail_sys(err, KILN_IO, errno, "%s: cannot link the cache entry: %s", lnk,
				    strerror(errno));
	free(lnk);
	return rc;
}

/* Remove the version `name` in d and, when it is that version, the URL's link; 0 when removed. */
static int remove_version(DIR *d, const char *dir, const char *name)
{
	struct stat v, l;
	char *path = NULL, *lnk = NULL;
	int have = !fstatat(dirfd(d), name, &v, AT_SYMLINK_NOFOLLOW);
	if (unlinkat(dirfd(d), name, 0))
		return -1;
	if (have && asprintf(&path, "%s/%s", dir, name) >= 0 && (lnk = link_of(path)) &&
	    !lstat(lnk, &l) && l.st_ino == v.st_ino && l.st_dev == v.st_dev)
		(void)unlink(lnk);
	free(lnk);
	free(path);
	return 0;
}

struct entry {
	char *name;
	uint64_t t, size;
};

static int by_age(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	return x->t < y->t ? -1 : x->t > y->t;
}

/* Remove the oldest entries until the cache holds at most max_bytes, never `keep`; and other
 * versions of the URL of `keep` (an object that changed). */
static void evict(const struct kiln__cache *c, const char *keep)
{
	const char *kb = strrchr(keep, '/');
	kb = kb ? kb + 1 : keep;
	DIR *d = opendir(c->dir);
	if (!d)
		return;
	struct entry *es = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		struct stat st;
		if (!is_entry(e->d_name) || fstatat(dirfd(d), e->d_name, &st, 0) ||
		    !S_ISREG(st.st_mode) || !strcmp(e->d_name, kb))
			continue;
		if (!memcmp(e->d_name, kb, URLHASH_LEN)) { /* an older version of the same URL */
			unlinkat(dirfd(d), e->d_name, 0);
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct entry *ne = realloc(es, nc * sizeof(*es));
			if (!ne)
				break;
			es = ne;
			cap = nc;
		}
		if (!(es[n].name = strdup(e->d_name)))
			break;
		es[n].t = mtime_ms(&st);
		es[n].size = (uint64_t)st.st_size;
		total += es[n].size;
		n++;
	}
	struct stat ks;
	if (!stat(keep, &ks))
		total += (uint64_t)ks.st_size;
	if (c->max_bytes && total > c->max_bytes) {
		qsort(es, n, sizeof(*es), by_age);
		for (size_t i = 0; i < n && total > c->max_bytes; i++)
			if (!remove_version(d, c->dir, es[i].name))
				total -= es[i].size;
	}
	for (size_t i = 0; i < n; i++)
		free(es[i].name);
	free(es);
	closedir(d);
}

int kiln__cache_store(const struct kiln__cache *c, const char *path, const uint8_t *bytes,
		      uint64_t len, kiln_error *err)
{
	/* The directory, made as `mkdir -p` would (private to the user). */
	char *dir = strdup(c->dir);
	if (!dir)
		return kiln__nomem(err, 0, NULL);
	for (char *s = dir + 1; *s; s++)
		if (*s == '/') {
			*s = '\0';
			mkdir(dir, 0700);
			*s = '/';
		}
	int rc = 0;
	if (mkdir(dir, 0700) && errno != EEXIST)
		rc =
		    kiln__fail_sys(err, KILN_IO, errno, "%s: cannot create the cache directory: %s",
				   dir, strerror(errno));
	free(dir);
	if (rc)
		return rc;
	if (c->max_bytes && len > c->max_bytes)
		return 0; /* larger than the whole cache: not kept */
	struct fill f = {bytes, len};
	rc = kiln_write_atomic(path, fill_file, &f, 0, err);
	if (rc == KILN_UNSYNCED)
		rc = 0; /* in place; a crash may lose it, which a cache may */
	if (!rc)
		rc = point_link(path, err);
	if (!rc)
		evict(c, path);
	return rc;
}
