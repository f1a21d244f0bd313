/* SPDX-License-Identifier: MIT */
/*
 * The REMOTE source: a file behind a URL (src/net/http.c). The first GET (FIRST_GET bytes from 0)
 * pins the object and holds most headers and directories whole; what the reader asks for past
 * it comes in one more GET that runs on to what the reader said it reads next (kiln__expect),
 * but never more than GROW_MIN (or as much as is already in hand) past what it asked for: the
 * memory a server's claims cost stays within twice the bytes it has sent (plus GROW_MIN). Every
 * head buffer is kept until close: views' names and the readers' prefixes point into them. Once the
 * reader has accepted the file, its payload is fetched into owned memory or the load buffer, many
 * GETs at a time; with KILN_OPEN_DIRECTORY_ONLY it stays on the server and each read is a GET.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "source/cache.h"
#include "net/net.h"
#include "source/source.h"

#define FIRST_GET KILN__REMOTE_FIRST_GET
#define GROW_MIN  KILN__REMOTE_GROW_MIN
/* Reads shorter than half of a window, of a file whose payload stayed on the server, fetch a
 * window and serve the reads after them from it: the rows of a slice, or tensors read one after
 * another, cost a GET per window instead of one each. */
#define WINDOW    KILN__REMOTE_WINDOW

struct old_head {
	struct old_head *next;
};

struct remote_state {
	struct kiln__remote *r;
	uint8_t *head; /* bytes [0, head_len) of the file */
	uint64_t head_len;
	struct old_head *old; /* earlier head buffers: pointers into them stay valid to close */
	uint64_t expect_end;
	uint8_t *block; /* the whole file's memory once finished: [0, block_end) present */
	uint64_t block_end;
	size_t cap;
	int owned;
	uint8_t *scratch; /* a fetch far past the head */
	size_t scratch_cap;
	struct kiln__cache cache;              /* its directory open while the file is fetched */
	char cache_name[KILN__CACHE_NAME_MAX]; /* the entry this version becomes; "": not cached */
	pthread_mutex_t window_lock;           /* reads may come from several threads */
	uint8_t *window;
	uint64_t window_off, window_len;
};

static struct remote_state *state(const struct kiln__file *f)
{
	return f->src_state;
}

/* A head buffer of `len` bytes, on the list freed at close. */
static uint8_t *new_head(struct remote_state *s, uint64_t len)
{
	struct old_head *o = malloc(sizeof(*o) + (size_t)len);
	if (!o)
		return NULL;
	o->next = s->old;
	s->old = o;
	return (uint8_t *)(o + 1);
}

static void remote_release(struct kiln__file *f);

/* The file is in the cache at `path` (taken over; with its descriptor fd and size when
 * fd >= 0): it becomes a local file of the source the options ask for, its URL kept for
 * messages and kiln_file_info. */
static int hand_to_cache(struct kiln__file *f, const kiln_open_options *o, char *path, int fd,
			 uint64_t size, kiln_error *err)
{
	remote_release(f);
	f->url = f->path;
	f->path = path;
	f->remote = 0;
	if (fd >= 0) {
		f->fd = fd;
		f->size = size;
	}
	f->src = kiln__source_for(0, o);
	return f->src->attach(f, o, NULL, 0, err);
}

static int remote_attach(struct kiln__file *f, const kiln_open_options *o, const void *buf,
			 size_t len, kiln_error *err)
{
	(void)buf, (void)len;
	f->load.source = KILN_SOURCE_REMOTE;
	/* A copy confirmed lately needs no server, no HTTP client and no state. */
	struct kiln__cache cache;
	kiln_error ignored; /* a cache that cannot be used is skipped; why is in cache.refused */
	int cached = kiln__cache_settings(o ? o->remote : NULL, &cache), fresh = 0, fd;
	if (cached && kiln__cache_open(&cache, 0, &ignored))
		cached = cache.refused == 0; /* not there yet: made when the file is stored */
	f->load.cache_refused = cache.refused;
	uint64_t size = 0;
	char *known =
	    cache.fd >= 0 ? kiln__cache_lookup(&cache, f->path, &fresh, &fd, &size) : NULL;
	if (fresh) {
		kiln__cache_close(&cache);
		return hand_to_cache(f, o, known, fd, size, err);
	}
	struct remote_state *s = calloc(1, sizeof(*s));
	if (!s) {
		free(known);
		kiln__cache_close(&cache);
		return kiln__nomem(err, sizeof(*s), "the file's state");
	}
	f->src_state = s;
	s->cache = cache;
	pthread_mutex_init(&s->window_lock, NULL);
	/* A copy to confirm: its ETag and size are all the first GET need bring (one byte), and an
	 * object that changed costs one more round trip. */
	uint64_t first = known ? 1 : FIRST_GET;
	free(known);
	int rc = kiln__remote_new(f->path, o ? o->remote : NULL, &s->r, err);
	if (rc)
		return rc;
	if (!(s->head = new_head(s, FIRST_GET)))
		return kiln__nomem(err, FIRST_GET, "the file's header");
	if ((rc = kiln__remote_pin(s->r, first, s->head, &s->head_len, err)))
		return rc;
	f->size = kiln__remote_size(s->r);
	if (f->size > SIZE_MAX)
		return kiln__fail_sys(err, KILN_IO, EFBIG,
				      "%s: %" PRIu64 " bytes do not fit in memory",
				      kiln__file_shown(f), f->size);
	const char *etag = kiln__remote_etag(s->r);
	if (cached && etag[0]) {
		kiln__cache_name(f->path, etag, f->size, s->cache_name);
		int hit =
		    s->cache.fd >= 0 ? kiln__cache_hit(&s->cache, s->cache_name, f->size) : -1;
		if (hit >= 0) {
			char *p = kiln__cache_path(&s->cache, s->cache_name);
			if (!p) {
				close(hit);
				return kiln__nomem(err, 0, NULL);
			}
			return hand_to_cache(f, o, p, hit, f->size, err);
		}
	}
	return 0;
}

/* Make [0, end) of the file present in the head (end <= f->size). */
static int grow_head(struct kiln__file *f, uint64_t end, kiln_error *err)
{
	struct remote_state *s = state(f);
	if (end <= s->head_len)
		return 0;
	uint64_t step = s->head_len > GROW_MIN ? s->head_len : GROW_MIN;
	uint64_t to = s->expect_end > end ? s->expect_end : end;
	if (to > end + step)
		to = end + step;
	if (to < FIRST_GET) /* after a one-byte first GET */
		to = FIRST_GET;
	if (to > f->size)
		to = f->size;
	uint8_t *head = new_head(s, to);
	if (!head)
		return kiln__nomem(err, to, "the file's header");
	memcpy(head, s->head, (size_t)s->head_len);
	struct kiln__span sp = {s->head_len, to - s->head_len, head + s->head_len};
	int rc = kiln__remote_get(s->r, &sp, 1, 0, NULL, err);
	if (rc)
		return rc;
	s->head = head;
	s->head_len = to;
	return 0;
}

static const uint8_t *remote_fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep,
				   kiln_error *err)
{
	struct remote_state *s = state(f);
	const uint8_t *p;
	if (off + len <= s->head_len || off <= s->head_len + GROW_MIN) {
		if (grow_head(f, off + len, err))
			return NULL;
		p = s->head + off;
	} else { /* far past the header: a GET of its own */
		if (len > s->scratch_cap) {
			uint8_t *n = realloc(s->scratch, (size_t)len);
			if (!n) {
				kiln__nomem(err, len, "a fetch");
				return NULL;
			}
			s->scratch = n;
			s->scratch_cap = (size_t)len;
		}
		struct kiln__span sp = {off, len, s->scratch};
		if (kiln__remote_get(s->r, &sp, 1, 0, NULL, err))
			return NULL;
		p = s->scratch;
	}
	if (!keep)
		return p;
	uint8_t *k = kiln__keep_alloc(f, (size_t)len, err);
	if (k)
		memcpy(k, p, (size_t)len);
	return k;
}

static const uint8_t *remote_prefix(struct kiln__file *f, uint64_t len, kiln_error *err)
{
	if (grow_head(f, len, err))
		return NULL;
	return state(f)->head;
}

static void remote_expect(struct kiln__file *f, uint64_t off, uint64_t end)
{
	(void)off;
	struct remote_state *s = state(f);
	if (end > s->expect_end)
		s->expect_end = end;
}

/* Keep the version just fetched in the cache with what the server has beside it: its digest
 * sidecar, fetched now (right after the version, with the same settings: the server could have
 * changed it in between, as between any two requests), or none (NOTFOUND), so that a check of
 * the cached copy has what a check of the URL would fetch (src/read/verify.c checks it as any
 * sidecar). Any other outcome keeps nothing: a failed fetch, or a sidecar longer than 1/64 of the
 * file plus 4 KiB (four times the largest table a file can have: 16 bytes for each 4 KiB chunk),
 * so that the next open asks the server again and its check meets the server's sidecar as a
 * URL's does. A cache that cannot be written is skipped. */
static void keep_version(struct kiln__file *f)
{
	struct remote_state *s = state(f);
	if (!kiln__cache_fits(&s->cache, f->size))
		return;
	size_t cap = (size_t)(f->size / 64) + 4096, len = 0;
	uint64_t size = 0;
	uint8_t *b = NULL;
	kiln_error ignored;
	int rc = kiln__remote_beside(s->r, KILN__SIDECAR_SUFFIX, cap, 0, &b, &len, &size, &ignored);
	if (rc == KILN_NOTFOUND || (!rc && size <= cap))
		(void)kiln__cache_store(&s->cache, s->cache_name, s->block, f->size, rc ? NULL : b,
					len, &ignored);
	free(b);
}

static int remote_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	struct remote_state *s = state(f);
	/* The payload's proven end: what the format accepted, not what the server claims. */
	uint64_t end = f->payload_base + f->payload_bytes;
	if (end > f->size || end < f->payload_base || s->cache_name[0])
		end = f->size; /* a cached copy is the whole object */
	int rc = kiln__file_memory(f->size, o ? o->buffer : NULL, o ? o->buffer_size : 0, 1,
				   &s->block, &s->cap, &s->owned, err);
	if (rc)
		return rc;
	uint64_t have = s->head_len < end ? s->head_len : end;
	memcpy(s->block, s->head, (size_t)have);
	struct kiln__span sp = {have, end - have, s->block + have};
	if ((rc = kiln__remote_get(s->r, &sp, 1, 1, NULL, err)))
		return rc;
	s->block_end = end;
	f->base = s->block;
	f->mem = end == f->size ? s->block : NULL;
	if (s->cache_name[0]) {
		keep_version(f);
		f->load.cache_refused = s->cache.refused;
	}
	return 0;
}

static void remote_release(struct kiln__file *f)
{
	struct remote_state *s = state(f);
	if (!s)
		return;
	kiln__remote_free(s->r);
	if (s->owned)
		kiln__owned_free(s->block, s->cap);
	while (s->old) {
		struct old_head *o = s->old;
		s->old = o->next;
		free(o);
	}
	free(s->scratch);
	free(s->window);
	kiln__cache_close(&s->cache);
	pthread_mutex_destroy(&s->window_lock);
	free(s);
	f->src_state = NULL;
	f->base = NULL;
	f->mem = NULL;
}

static int remote_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		       kiln_error *err)
{
	struct remote_state *s = state(f);
	if (!len)
		return 0;
	if (s->block && off + len <= s->block_end) {
		memcpy(dst, s->block + off, len);
		return 0;
	}
	if (off + len <= s->head_len) {
		memcpy(dst, s->head + off, len);
		return 0;
	}
	if (len >= WINDOW / 2) {
		struct kiln__span sp = {off, len, dst};
		return kiln__remote_get(s->r, &sp, 1, 0, NULL, err);
	}
	int rc = 0;
	pthread_mutex_lock(&s->window_lock);
	if (!s->window && !(s->window = malloc(WINDOW)))
		rc = kiln__nomem(err, WINDOW, "a read window");
	if (!rc && (off < s->window_off || off + len > s->window_off + s->window_len)) {
		uint64_t n = f->size - off < WINDOW ? f->size - off : WINDOW;
		struct kiln__span sp = {off, n, s->window};
		s->window_len = 0;
		if (!(rc = kiln__remote_get(s->r, &sp, 1, 0, NULL, err))) {
			s->window_off = off;
			s->window_len = n;
		}
	}
	if (!rc)
		memcpy(dst, s->window + (off - s->window_off), len);
	pthread_mutex_unlock(&s->window_lock);
	return rc;
}

/* Spans the memory already holds are copied; the rest go in one batch of GETs, many in flight,
 * neighbours fetched together. */
static int remote_read_spans(const struct kiln__file *f, const struct kiln__span *spans, size_t n,
			     const _Atomic int *stop, kiln_error *err)
{
	struct remote_state *s = state(f);
	struct kiln__span *rest = malloc((n ? n : 1) * sizeof(*rest));
	if (!rest)
		return kiln__nomem(err, n * sizeof(*rest), "the spans of a read");
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const struct kiln__span *p = &spans[i];
		if (s->block && p->off + p->len <= s->block_end)
			memcpy(p->dst, s->block + p->off, (size_t)p->len);
		else if (p->off + p->len <= s->head_len)
			memcpy(p->dst, s->head + p->off, (size_t)p->len);
		else if (p->len)
			rest[k++] = *p;
	}
	int rc = k ? kiln__remote_get(s->r, rest, k, 0, stop, err) : 0;
	free(rest);
	return rc;
}

/* Beside the URL on its server, with its credentials (kiln__remote_beside). */
static int remote_beside(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
			 uint8_t **out, size_t *len, uint64_t *size, kiln_error *err)
{
	const struct remote_state *s = f->src_state;
	if (!s || !s->r)
		return kiln__fail_inval(err, KILN_NO_INDEX, "model", "the file is not open");
	return kiln__remote_beside(s->r, suffix, cap, head, out, len, size, err);
}

/* The ETag the first GET pinned: every later GET asks for it (If-Match). */
static const char *remote_version(const struct kiln__file *f)
{
	const struct remote_state *s = f->src_state;
	return s && s->r ? kiln__remote_etag(s->r) : "";
}

const struct kiln__source kiln__source_remote = {
    .id = KILN_SOURCE_REMOTE,
    .attach = remote_attach,
    .fetch = remote_fetch,
    .prefix = remote_prefix,
    .expect = remote_expect,
    .finish = remote_finish,
    .release = remote_release,
    .read = remote_read,
    .read_spans = remote_read_spans,
    .beside = remote_beside,
    .feed = kiln__feed_local,
    .version = remote_version,
    .pinnable = 1,
};
