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
 * used without asking the server. The server's digest sidecar of a version, fetched with it, is
 * kept beside it as URLHASH-VERSIONHASH.EXT.kiln-digest: bound to that version by its name, gone
 * with it, never an entry of its own.
 *
 * The names are predictable (anyone who knows the URL and the ETag can compute them), so the
 * cache is a private store or nothing: the directory must belong to the effective user and be
 * writable by no one else, every step goes through its descriptor without following a symlink
 * (entries are created anonymous, O_TMPFILE, and linked or renamed into place: a link planted
 * at a name is replaced, never written through), and only an entry that is a regular file of the
 * user's, writable by no one else, is served.
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
#include "base/sys.h"
#include "net/net.h"
#include "net/url.h"
#include "source/cache.h"
#include "source/file.h"

#define URLHASH_LEN 32

/* A number from the environment: decimal digits only, no sign, no overflow. */
static int env_number(const char *name, uint64_t *out, const char **bad)
{
	const char *v = kiln__env(name);
	if (!v)
		return 0;
	uint64_t x = 0;
	int ok = *v != '\0';
	for (const char *p = v; ok && *p; p++)
		ok = *p >= '0' && *p <= '9' && x <= (UINT64_MAX - (uint64_t)(*p - '0')) / 10 &&
		     (x = x * 10 + (uint64_t)(*p - '0'), 1);
	if (!ok && !*bad)
		*bad = name;
	*out = ok ? x : 0;
	return ok;
}

int kiln__cache_settings(const kiln_remote_options *o, struct kiln__cache *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->dir = o && o->cache_dir ? o->cache_dir : kiln__env("KILN_CACHE_DIR");
	if (c->dir && !*c->dir)
		c->dir = NULL;
	if (o && o->cache_max_bytes)
		c->max_bytes = o->cache_max_bytes;
	else
		env_number("KILN_CACHE_MAX_BYTES", &c->max_bytes, &c->bad_env);
	if (o && o->cache_max_age_ms)
		c->max_age_ms = o->cache_max_age_ms;
	else
		env_number("KILN_CACHE_MAX_AGE_MS", &c->max_age_ms, &c->bad_env);
	return c->dir != NULL;
}

static int refuse(struct kiln__cache *c, int e, kiln_error *err, const char *why)
{
	if (e != ENOENT)
		c->refused = e;
	return kiln__fail_sys(err, KILN_IO, e, "%s: not used as the cache: %s", c->dir, why);
}

int kiln__cache_open(struct kiln__cache *c, int create, kiln_error *err)
{
	if (c->fd >= 0)
		return 0;
	if (c->bad_env) { /* a cache of unknown limits: none, rather than a guess */
		char why[96];
		snprintf(why, sizeof(why), "%s is not a number (decimal digits only)", c->bad_env);
		return refuse(c, EINVAL, err, why);
	}
	if (create) { /* as `mkdir -p` would, private to the user */
		char *dir = strdup(c->dir);
		if (!dir)
			return kiln__nomem(err, 0, NULL);
		for (char *s = dir + 1; *s; s++)
			if (*s == '/') {
				*s = '\0';
				(void)mkdir(dir, 0700);
				*s = '/';
			}
		(void)mkdir(dir, 0700);
		free(dir);
	}
	int fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return refuse(c, errno, err, strerror(errno));
	struct stat st;
	char why[160];
	int e = fstat(fd, &st) ? errno : 0;
	if (e)
		snprintf(why, sizeof(why), "%s", strerror(e));
	else if (st.st_uid != geteuid())
		snprintf(why, sizeof(why), "it belongs to uid %u, not to this user (uid %u)",
			 (unsigned)st.st_uid, (unsigned)geteuid());
	else if (st.st_mode & (S_IWGRP | S_IWOTH))
		snprintf(why, sizeof(why),
			 "others can write to it (mode %04o): a cache must be private (chmod go-w)",
			 (unsigned)(st.st_mode & 07777));
	else {
		c->fd = fd;
		return 0;
	}
	close(fd);
	return refuse(c, e ? e : EPERM, err, why);
}

int kiln_cache_check(const kiln_remote_options *o, kiln_error *err)
{
	kiln__clear_error(err);
	int rc = kiln__remote_check_options(o, err);
	if (rc)
		return rc;
	struct kiln__cache c;
	if (!kiln__cache_settings(o, &c))
		return 0;
	rc = kiln__cache_open(&c, 0, err);
	kiln__cache_close(&c);
	if (rc && !c.refused) { /* not made yet: it will be, private */
		kiln__clear_error(err);
		return 0;
	}
	return rc;
}

void kiln__cache_close(struct kiln__cache *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
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

void kiln__cache_name(const char *url, const char *etag, uint64_t size,
		      char out[KILN__CACHE_NAME_MAX])
{
	char uh[URLHASH_LEN + 1];
	const char *ext;
	url_hash(url, uh, &ext);
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, etag, strlen(etag) + 1);
	XXH3_64bits_update(&st, &size, sizeof(size));
	snprintf(out, KILN__CACHE_NAME_MAX, "%s-%016" PRIx64 "%s", uh,
		 (uint64_t)XXH3_64bits_digest(&st), ext);
}

char *kiln__cache_path(const struct kiln__cache *c, const char *name)
{
	char *p = NULL;
	return asprintf(&p, "%s/%s", c->dir, name) < 0 ? NULL : p;
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

/* The name of entry `name`'s sidecar (entries are shorter than KILN__CACHE_NAME_MAX). */
static void sidecar_name(const char *name, char out[KILN__CACHE_NAME_MAX + 16])
{
	snprintf(out, KILN__CACHE_NAME_MAX + 16, "%.*s%s", KILN__CACHE_NAME_MAX - 1, name,
		 KILN__SIDECAR_SUFFIX);
}

int kiln__cache_is_entry(const char *name)
{
	size_t n = strlen(name), k = strlen(KILN__SIDECAR_SUFFIX);
	if (n < URLHASH_LEN + 18 || name[URLHASH_LEN] != '-' ||
	    (n > k && !strcmp(name + n - k, KILN__SIDECAR_SUFFIX)))
		return 0;
	for (size_t i = 0; i < URLHASH_LEN + 17; i++)
		if (i != URLHASH_LEN && !strchr("0123456789abcdef", name[i]))
			return 0;
	return name[URLHASH_LEN + 17] == '.' && n < KILN__CACHE_NAME_MAX && !strchr(name, '/');
}

void kiln__cache_link_name(const char *entry, char out[KILN__CACHE_NAME_MAX])
{
	snprintf(out, KILN__CACHE_NAME_MAX, "%.*s%s", URLHASH_LEN, entry, entry + URLHASH_LEN + 17);
}

/* The flags a cache file is opened with: never through a symlink (O_NONBLOCK: a FIFO in its
 * place does not block). */
#define SERVE_FLAGS (O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW)

/* Why the open descriptor d of a cache file may not be served (0: it may): what is served is a
 * regular file of the user's that no one else may write. *st is its status. */
static int unservable(int d, struct stat *st)
{
	if (fstat(d, st))
		return errno;
	if (!S_ISREG(st->st_mode))
		return EINVAL;
	return st->st_uid != geteuid() || (st->st_mode & (S_IWGRP | S_IWOTH)) ? EPERM : 0;
}

/* Entry `name` opened to be served (unservable); -1. */
static int open_entry(const struct kiln__cache *c, const char *name, struct stat *st)
{
	int d = openat(c->fd, name, SERVE_FLAGS);
	if (d < 0)
		return -1;
	if (unservable(d, st) || (uint64_t)st->st_size > SIZE_MAX) {
		close(d);
		return -1;
	}
	fcntl(d, F_SETFL, 0);
	return d;
}

char *kiln__cache_lookup(const struct kiln__cache *c, const char *url, int *fresh, int *fd,
			 uint64_t *size)
{
	*fresh = 0;
	*fd = -1;
	char uh[URLHASH_LEN + 1], name[KILN__CACHE_NAME_MAX];
	const char *ext;
	url_hash(url, uh, &ext);
	snprintf(name, sizeof(name), "%s%s", uh, ext);
	/* Opened, not stat'ed: a fresh copy's descriptor is the one the local source maps, so a
	 * fresh hit costs no system call a local open does not make. */
	struct stat st; /* of the version the link names */
	int d = open_entry(c, name, &st);
	char *p = d >= 0 ? kiln__cache_path(c, name) : NULL;
	if (!p) {
		if (d >= 0)
			close(d);
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
	*fd = d;
	*size = (uint64_t)st.st_size;
	return p;
}

int kiln__cache_hit(const struct kiln__cache *c, const char *name, uint64_t size)
{
	struct stat st;
	int d = open_entry(c, name, &st);
	if (d >= 0 && (uint64_t)st.st_size != size) {
		close(d);
		return -1;
	}
	if (d >= 0)
		(void)futimens(d, NULL); /* confirmed now: last to be evicted */
	return d;
}

char *kiln__cache_version_path(const char *link, int fd)
{
	const char *base = strrchr(link, '/');
	struct stat want;
	if (!base) {
		errno = EINVAL;
		return NULL;
	}
	if (fstat(fd, &want))
		return NULL;
	char *dir = strndup(link, base > link ? (size_t)(base - link) : 1);
	if (!dir) {
		errno = ENOMEM;
		return NULL;
	}
	/* The directory again, held to what the cache that served the copy held it to. */
	struct kiln__cache c = {.dir = dir, .fd = -1};
	DIR *d = NULL;
	int err = kiln__cache_open(&c, 0, NULL) ? (c.refused ? c.refused : ENOENT) : 0;
	if (!err && !(d = fdopendir(c.fd))) {
		err = errno;
		kiln__cache_close(&c);
	}
	char *found = NULL;
	for (struct dirent *e; !err;) {
		errno = 0;
		if (!(e = readdir(d))) {
			err = errno ? errno : ENOENT; /* an error, or no entry is that file */
			break;
		}
		char lnk[KILN__CACHE_NAME_MAX];
		struct stat st;
		if (!kiln__cache_is_entry(e->d_name))
			continue;
		kiln__cache_link_name(e->d_name, lnk);
		/* The same file, not the same name: only a hard link of it shares its inode. */
		if (strcmp(lnk, base + 1) || fstatat(c.fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    st.st_dev != want.st_dev || st.st_ino != want.st_ino)
			continue;
		if (asprintf(&found, "%s/%s", dir, e->d_name) < 0)
			found = NULL, err = ENOMEM;
		break;
	}
	if (d)
		closedir(d); /* and c.fd with it */
	free(dir);
	errno = err;
	return found;
}

/* Make URLHASH.EXT name the version `name`. Between the unlink and the link a reader finds no
 * name and asks the server, which names this version: a round trip, never a wrong file. */
static int point_link(const struct kiln__cache *c, const char *name, kiln_error *err)
{
	char lnk[KILN__CACHE_NAME_MAX];
	kiln__cache_link_name(name, lnk);
	(void)unlinkat(c->fd, lnk, 0);
	if (linkat(c->fd, name, c->fd, lnk, 0) && errno != EEXIST) /* EEXIST: another writer */
		return kiln__fail_sys(err, KILN_IO, errno, "%s/%s: cannot link the cache entry: %s",
				      c->dir, lnk, strerror(errno));
	return 0;
}

/* Remove the version `name`, its sidecar and, when it is that version, the URL's link; 0 when
 * removed. */
static int remove_version(const struct kiln__cache *c, const char *name)
{
	struct stat v, l;
	int have = !fstatat(c->fd, name, &v, AT_SYMLINK_NOFOLLOW);
	if (unlinkat(c->fd, name, 0))
		return -1;
	char side[KILN__CACHE_NAME_MAX + 16];
	sidecar_name(name, side);
	(void)unlinkat(c->fd, side, 0);
	char lnk[KILN__CACHE_NAME_MAX];
	kiln__cache_link_name(name, lnk);
	if (have && !fstatat(c->fd, lnk, &l, AT_SYMLINK_NOFOLLOW) && l.st_ino == v.st_ino &&
	    l.st_dev == v.st_dev)
		(void)unlinkat(c->fd, lnk, 0);
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

/* Bytes of the sidecar kept with entry `name`, 0 when none. */
static uint64_t sidecar_size(const struct kiln__cache *c, const char *name)
{
	char side[KILN__CACHE_NAME_MAX + 16];
	struct stat st;
	sidecar_name(name, side);
	return fstatat(c->fd, side, &st, AT_SYMLINK_NOFOLLOW) ? 0 : (uint64_t)st.st_size;
}

/* Whether `name` is a sidecar whose version is gone (removed now), or one whose version may
 * still be on its way: kiln__cache_store publishes the sidecar a moment before its version, so
 * only one older than a minute is an orphan (a crash between the two, or a version removed by
 * another process in that moment). */
static int orphan(const struct kiln__cache *c, const char *name)
{
	size_t n = strlen(name), k = strlen(KILN__SIDECAR_SUFFIX);
	if (n <= k || n - k >= KILN__CACHE_NAME_MAX || strcmp(name + n - k, KILN__SIDECAR_SUFFIX))
		return 0;
	char stem[KILN__CACHE_NAME_MAX];
	memcpy(stem, name, n - k);
	stem[n - k] = 0;
	struct stat st;
	if (!kiln__cache_is_entry(stem) || !fstatat(c->fd, stem, &st, AT_SYMLINK_NOFOLLOW))
		return 1; /* not ours to judge, or kept with its version: not an entry either way */
	if (!fstatat(c->fd, name, &st, AT_SYMLINK_NOFOLLOW) && mtime_ms(&st) + 60000 < now_ms())
		(void)unlinkat(c->fd, name, 0);
	return 1;
}

/* Remove the oldest entries (each with its sidecar) until the cache holds at most max_bytes,
 * never `keep`; other versions of the URL of `keep` (an object that changed); and sidecars left
 * without their version. */
static void evict(const struct kiln__cache *c, const char *keep)
{
	int dfd = openat(c->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	struct entry *es = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		struct stat st;
		if (orphan(c, e->d_name))
			continue;
		if (!kiln__cache_is_entry(e->d_name) ||
		    fstatat(c->fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode) ||
		    !strcmp(e->d_name, keep))
			continue;
		if (!memcmp(e->d_name, keep, URLHASH_LEN)) { /* an older version of the same URL */
			(void)remove_version(c, e->d_name);
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
		es[n].size = (uint64_t)st.st_size + sidecar_size(c, e->d_name);
		total += es[n].size;
		n++;
	}
	struct stat ks;
	if (!fstatat(c->fd, keep, &ks, AT_SYMLINK_NOFOLLOW))
		total += (uint64_t)ks.st_size + sidecar_size(c, keep);
	if (c->max_bytes && total > c->max_bytes) {
		qsort(es, n, sizeof(*es), by_age);
		for (size_t i = 0; i < n && total > c->max_bytes; i++)
			if (!remove_version(c, es[i].name))
				total -= es[i].size;
	}
	for (size_t i = 0; i < n; i++)
		free(es[i].name);
	free(es);
	closedir(d);
}

/* `len` bytes published as `name` in the open cache, atomically. */
static int publish(struct kiln__cache *c, const char *name, const uint8_t *bytes, uint64_t len,
		   kiln_error *err)
{
	char *shown = kiln__cache_path(c, name);
	if (!shown)
		return kiln__nomem(err, 0, NULL);
	struct kiln__pending w;
	int rc = kiln__pending_create_at(&w, c->fd, name, shown, 0, err);
	if (!rc) {
		int e = kiln__write_all(w.fd, bytes, (size_t)len);
		if (e)
			rc = kiln__fail_sys(err, KILN_IO, e, "%s: cannot write: %s", shown,
					    strerror(e));
	}
	if (!rc)
		rc = kiln__pending_seal(&w, 0, err);
	if (!rc)
		rc = kiln__publish(&w, 1, err);
	kiln__pending_drop(&w);
	free(shown);
	if (rc == KILN_UNSYNCED)
		rc = 0; /* in place; a crash may lose it, which a cache may */
	return rc;
}

int kiln__cache_fits(const struct kiln__cache *c, uint64_t len)
{
	return !c->max_bytes || len <= c->max_bytes;
}

int kiln__cache_store(struct kiln__cache *c, const char *name, const uint8_t *bytes, uint64_t len,
		      const uint8_t *sidecar, size_t sidecar_len, kiln_error *err)
{
	int rc = kiln__cache_open(c, 1, err);
	if (rc)
		return rc;
	if (!kiln__cache_fits(c, len))
		return 0; /* larger than the whole cache: not kept */
	/* The sidecar first: once the version has its name, what is beside it is what the server
	 * had (a sidecar, or none). */
	char side[KILN__CACHE_NAME_MAX + 16];
	sidecar_name(name, side);
	if (sidecar)
		rc = publish(c, side, sidecar, sidecar_len, err);
	else
		(void)unlinkat(c->fd, side, 0); /* a stale one of the same version */
	if (!rc && (rc = publish(c, name, bytes, len, err)) && sidecar)
		(void)unlinkat(c->fd, side, 0);
	if (!rc)
		rc = point_link(c, name, err);
	if (!rc)
		evict(c, name);
	return rc;
}

int kiln__cache_open_sidecar(const char *path, uint64_t *size)
{
	int d = open(path, SERVE_FLAGS);
	if (d < 0)
		return -1;
	struct stat st;
	int e = unservable(d, &st);
	if (e) {
		close(d);
		errno = e;
		return -1;
	}
	*size = (uint64_t)st.st_size;
	return d;
}
