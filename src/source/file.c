/* SPDX-License-Identifier: MIT */
/*
 * A file of a model and its source: opening a local file, picking the source table, and every
 * use of an open file that depends on how its bytes arrived, dispatched through that table
 * (src/source/source.h). The readers' services (fetch, prefix, expect, kept memory) are here
 * too: they are the sources' side of the bargain with the format readers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sys.h"
#include "io/engine.h"
#include "net/url.h"
#include "source/cache.h"
#include "source/source.h"

const char *kiln_source_name(unsigned source)
{
	static const char *const names[] = {"mmap", "buffer", "read", "uring", "auto", "remote"};
	return source < sizeof(names) / sizeof(names[0]) ? names[source] : NULL;
}

/* A URL's source when the resolver found one; else from the options, the table the caller
 * named; AUTO is the mapping, which then decides per file (src/source/map.c), unless owned bytes
 * were asked for in so many words (a load buffer, O_DIRECT): io_uring, the faster owned load. */
const struct kiln__source *kiln__source_for(int remote, const kiln_open_options *o)
{
	if (remote)
		return &kiln__source_remote;
	static const struct kiln__source *const by_id[] = {
	    [KILN_SOURCE_MMAP] = &kiln__source_map,
	    [KILN_SOURCE_READ] = &kiln__source_read,
	    [KILN_SOURCE_URING] = &kiln__source_uring,
	};
	unsigned s = o ? o->source : KILN_SOURCE_MMAP;
	if (s == KILN_SOURCE_AUTO)
		return o->buffer || (o->flags & KILN_OPEN_DIRECT) ? &kiln__source_uring
								  : &kiln__source_map;
	return by_id[s];
}

void kiln__file_init(struct kiln__file *f, struct kiln_model *m, const kiln_allocator *alloc,
		     uint32_t no)
{
	memset(f, 0, sizeof(*f));
	f->model = m;
	f->alloc = alloc;
	f->no = no;
	f->fd = -1;
}

int kiln__file_attach(struct kiln__file *f, const kiln_open_options *o, int buffer, const void *buf,
		      size_t len, kiln_error *err)
{
	f->src = buffer ? &kiln__source_buffer : kiln__source_for(f->remote, o);
	if (f->remote && !f->shown) {
		if (!(f->shown = malloc(KILN__URL_SHOWN)))
			return kiln__nomem(err, 0, NULL);
		kiln__url_shown(f->path, f->shown, KILN__URL_SHOWN);
	}
	return f->src->attach(f, o, buf, len, err);
}

int kiln__file_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	return f->src->finish ? f->src->finish(f, o, err) : 0;
}

void kiln__file_release(struct kiln__file *f)
{
	if (f->src)
		f->src->release(f);
	if (f->held_release)
		f->held_release(f, f->held);
	f->held = NULL;
	f->held_release = NULL;
	while (f->kept) {
		struct kiln__kept *k = f->kept;
		f->kept = k->next;
		kiln__free(f->alloc, k, k->len);
	}
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	free(f->path);
	f->path = NULL;
	free(f->url);
	f->url = NULL;
	free(f->shown);
	f->shown = NULL;
}

/* --- what readers and sources share ---------------------------------------------------------- */

int kiln__fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep, const uint8_t **p,
		kiln_error *err)
{
	*p = f->src->fetch(f, off, len, keep, err);
	return *p ? 0 : err ? err->code : KILN_IO;
}

int kiln__prefix(struct kiln__file *f, uint64_t len, const uint8_t **p, kiln_error *err)
{
	*p = f->src->prefix(f, len, err);
	return *p ? 0 : err ? err->code : KILN_IO;
}

void kiln__prefix_keep(struct kiln__file *f, uint64_t len)
{
	if (f->src->prefix_keep)
		f->src->prefix_keep(f, len);
}

void kiln__expect(struct kiln__file *f, uint64_t off, uint64_t end)
{
	if (f->src->expect)
		f->src->expect(f, off, end);
}

void *kiln__keep_alloc(struct kiln__file *f, size_t len, kiln_error *err)
{
	size_t head = sizeof(struct kiln__kept);
	if (len > SIZE_MAX - head) {
		kiln__nomem(err, len, "the directory");
		return NULL;
	}
	struct kiln__kept *k = kiln__alloc(f->alloc, head + len);
	if (!k) {
		kiln__nomem(err, len, "the directory");
		return NULL;
	}
	k->len = head + len;
	k->next = f->kept;
	f->kept = k;
	return (uint8_t *)k + head;
}

/* --- local files ----------------------------------------------------------------------------- */

static int sys_fail(kiln_error *err, const char *path, const char *what, int e)
{
	return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e, "%s: %s: %s", path, what,
			      strerror(e));
}

int kiln__open_file(const char *path, uint64_t *size, kiln_error *err)
{
	/* O_NONBLOCK: opening a FIFO must not hang waiting for a writer; it is refused below. */
	int fd = kiln__sys.open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		sys_fail(err, path, "cannot open", errno);
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		sys_fail(err, path, "cannot stat", errno);
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		close(fd);
		kiln__fail_sys(err, KILN_IO, e, "%s: not a regular file (%s)", path,
			       S_ISDIR(st.st_mode)    ? "a directory"
			       : S_ISFIFO(st.st_mode) ? "a FIFO"
			       : S_ISCHR(st.st_mode)  ? "a character device"
			       : S_ISBLK(st.st_mode)  ? "a block device"
			       : S_ISSOCK(st.st_mode) ? "a socket"
						      : "not a file");
		return -1;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		close(fd);
		kiln__fail_sys(err, KILN_IO, EFBIG, "%s: too large to map", path);
		return -1;
	}
	/* Regular files ignore O_NONBLOCK for reads, but keep the descriptor plain. */
	fcntl(fd, F_SETFL, 0);
	*size = (uint64_t)st.st_size;
	return fd;
}

int kiln__file_open(struct kiln__file *f, kiln_error *err)
{
	if (f->fd < 0)
		f->fd = kiln__open_file(f->path, &f->size, err);
	return f->fd;
}

/* --- the uses of an open file ------------------------------------------------------------------
 */

/* A read's failure names the file it is about (a truncated file, a server's answer). */
static int named(const struct kiln__file *f, int rc, kiln_error *err)
{
	if (rc == KILN_IO && err && f->path) {
		kiln__error_named(err, kiln__file_shown(f));
		err->file = f->no;
	}
	return rc;
}

int kiln__file_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		    kiln_error *err)
{
	return named(f, f->src->read(f, off, dst, len, err), err);
}

int kiln__file_read_spans(const struct kiln__file *f, const struct kiln__span *spans, size_t n,
			  const _Atomic int *stop, kiln_error *err)
{
	if (f->src->read_spans)
		return named(f, f->src->read_spans(f, spans, n, stop, err), err);
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++)
		rc = f->src->read(f, spans[i].off, spans[i].dst, (size_t)spans[i].len, err);
	return named(f, rc, err);
}

int kiln__file_beside(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
		      uint8_t **out, size_t *len, uint64_t *size, kiln_error *err)
{
	*out = NULL;
	*len = 0;
	*size = 0;
	if (!f->src->beside || !f->path)
		return kiln__fail_inval(err, KILN_NO_INDEX, "model",
					"a model parsed from memory has no file to look beside");
	return f->src->beside(f, suffix, cap, head, out, len, size, err);
}

#define VERSION_LEFT                                                                           \
	"no digests (no table of its own; its version left kiln's cache after it was opened, " \
	"and its %s with it)"

/* In *path (malloc'ed), the sidecar kiln's cache keeps with the version of f, a URL's cached
 * copy: 0, or NOTFOUND, IO, NOMEM. A copy opened without asking the server (a fresh hit) was opened
 * through the URL's link, which names no version: its version is the entry that is the same file.
 */
static int kept_sidecar(const struct kiln__file *f, const char *suffix, char **path,
			kiln_error *err)
{
	const char *base = strrchr(f->path, '/');
	char *entry = NULL;
	int e = 0;
	*path = NULL;
	if (strcmp(suffix, KILN__SIDECAR_SUFFIX))
		return kiln__fail_named(err, kiln__file_shown(f), KILN_NOTFOUND, KILN_NO_INDEX,
					NULL, KILN_NO_OFFSET,
					"kiln's cache keeps no %s beside a copy", suffix);
	if (!kiln__cache_is_entry(base ? base + 1 : f->path) &&
	    !(entry = f->fd >= 0 ? kiln__cache_version_path(f->path, f->fd) : NULL))
		e = f->fd >= 0 ? errno : EBADF;
	if (!e && asprintf(path, "%s%s", entry ? entry : f->path, suffix) < 0)
		e = ENOMEM, *path = NULL;
	free(entry);
	if (e == ENOENT)
		return kiln__fail_named(err, kiln__file_shown(f), KILN_NOTFOUND, KILN_NO_INDEX,
					NULL, KILN_NO_OFFSET, VERSION_LEFT, suffix);
	if (e == ENOMEM)
		return kiln__nomem(err, 0, NULL);
	if (e)
		return kiln__fail_sys(
		    err, KILN_IO, e, "%s: cannot find the version of this copy in kiln's cache: %s",
		    f->path, strerror(e));
	return 0;
}

/* Whether the cache entry `name` less its `suffix` is still the copy f has open: a kept sidecar
 * that is missing then means the server had none; one whose version is gone was evicted with it
 * after the open. For the message only (a copy without a descriptor counts as still there). */
static int still_cached(const struct kiln__file *f, const char *name, const char *suffix)
{
	struct stat a;
	char *entry = strndup(name, strlen(name) - strlen(suffix));
	int same = f->fd < 0 || (entry && lstat(entry, &a) == 0 && kiln__file_is(f, &a));
	free(entry);
	return same;
}

int kiln__beside_local(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
		       uint8_t **out, size_t *len, uint64_t *size, kiln_error *err)
{
	char *name = NULL;
	kiln_error opened;
	int fd, rc = 0;
	if (f->url) { /* a URL's copy in kiln's cache: the sidecar kept with its version, if any */
		int e = 0;
		if ((rc = kept_sidecar(f, suffix, &name, err)))
			return rc;
		if ((fd = kiln__cache_open_sidecar(name, size)) < 0 && (e = errno) == ENOENT) {
			int kept = still_cached(f, name, suffix);
			free(name);
			return kiln__fail_named(
			    err, kiln__file_shown(f), KILN_NOTFOUND, KILN_NO_INDEX, NULL,
			    KILN_NO_OFFSET,
			    kept ? "no digests (no table of its own; kiln's cache keeps no %s for "
				   "this version: the server had none, or an older kiln cached it)"
				 : VERSION_LEFT,
			    suffix);
		}
		if (fd < 0)
			kiln__fail_sys(&opened, KILN_IO, e, "%s: cannot open: %s", name,
				       e == ELOOP    ? "a symbolic link, not followed"
				       : e == EINVAL ? "not a regular file"
				       : e == EPERM  ? "not the user's own, or writable by others"
						     : strerror(e));
	} else {
		if (asprintf(&name, "%s%s", f->path, suffix) < 0)
			return kiln__nomem(err, 0, NULL);
		fd = kiln__open_file(name, size, &opened);
	}
	if (fd < 0) {
		rc = opened.sys_errno == ENOENT ? KILN_NOTFOUND : opened.code;
		if (rc == KILN_NOTFOUND)
			kiln__fail_named(&opened, name, KILN_NOTFOUND, KILN_NO_INDEX, NULL,
					 KILN_NO_OFFSET, "no such file");
		if (err)
			*err = opened;
		free(name);
		return rc;
	}
	*len = *size > cap ? (*size < head ? (size_t)*size : head) : (size_t)*size;
	*out = malloc(*len ? *len : 1);
	rc = *out ? kiln__pread_full(fd, *out, *len, 0, err) : kiln__nomem(err, *len, "a sidecar");
	if (rc) {
		kiln__error_prefix(err, name);
		free(*out);
		*out = NULL;
		*len = 0;
	}
	close(fd);
	free(name);
	return rc;
}

void kiln__file_feed(const struct kiln__file *f, unsigned how, struct kiln__feed *out)
{
	*out = (struct kiln__feed){.fd = -1};
	if (f->src->feed)
		f->src->feed(f, how, out);
}

void kiln__feed_done(struct kiln__feed *feed)
{
	if (feed->owned && feed->fd >= 0)
		close(feed->fd);
	feed->fd = -1;
	feed->owned = 0;
}

/* Where the bytes are in memory the engine copies them (reading the file again would cost a
 * second pass over the disk or page cache for bytes a memcpy gives); a mapping is not memory in
 * that sense (its pages may still have to come from the disk), so it gives its descriptor. */
void kiln__feed_local(const struct kiln__file *f, unsigned how, struct kiln__feed *out)
{
	out->fd = f->fd;
	if (f->mem && (!(how & KILN__FEED_FILE) || f->fd < 0)) {
		out->mem = f->mem;
		return;
	}
	if (!(how & KILN__FEED_RANDOM) || f->fd < 0)
		return;
	/* Reopened from the same open file (not the path, which may name a newer one). Without
	 * a descriptor of its own the shared one serves, with its read-ahead. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", f->fd);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
		out->fd = fd;
		out->owned = 1;
	}
}

void kiln__advise_local(const struct kiln__file *f, uint64_t off, uint64_t len, int advice)
{
	static const int of[] = {
	    [KILN__ADVISE_NORMAL] = POSIX_FADV_NORMAL,
	    [KILN__ADVISE_RANDOM] = POSIX_FADV_RANDOM,
	    [KILN__ADVISE_DONTNEED] = POSIX_FADV_DONTNEED,
	};
	/* Bytes in memory are not read through the page cache. */
	if (f->fd >= 0 && !f->mem)
		posix_fadvise(f->fd, (off_t)off, (off_t)len, of[advice]);
}

void kiln__file_advise(const struct kiln__file *f, uint64_t off, uint64_t len, int advice)
{
	if (f->src->advise)
		f->src->advise(f, off, len, advice);
}

const char *kiln__file_version(const struct kiln__file *f)
{
	return f->src && f->src->version ? f->src->version(f) : "";
}

int kiln__file_is(const struct kiln__file *f, const struct stat *st)
{
	struct stat b;
	/* The open descriptor where there is one: the file itself, whatever its name now. */
	int same = f->fd >= 0 ? !fstat(f->fd, &b) : f->path && !f->remote && !stat(f->path, &b);
	return same && st->st_dev == b.st_dev && st->st_ino == b.st_ino;
}

int kiln__file_can_hint(const struct kiln__file *f)
{
	return f->src->hint != NULL;
}

int kiln__file_hint(const struct kiln__file *f, void *p, size_t len, unsigned hint)
{
	return f->src->hint ? f->src->hint(f, p, len, hint) : EOPNOTSUPP;
}

int kiln__file_pinnable(const struct kiln__file *f)
{
	return f->src->pinnable;
}
