/* SPDX-License-Identifier: MIT */
/*
 * The MMAP source: the header and directory read with pread into memory of the file's own (never
 * through the mapping, so a file that shrinks meanwhile cannot raise SIGBUS), then, once the
 * reader has accepted the file, a read-only shared mapping of it (a copy-on-write private one with
 * KILN_OPEN_PRIVATE), the caller's advice, huge pages, and lock or populate. KILN_SOURCE_AUTO is
 * this source deciding what to populate (or handing a file it cannot map to the READ source).
 *
 * How the directory is read: the first 64 bytes once (every format's header starts there); a
 * directory already in the page cache and small (the warm open) in one pread of its own, with no
 * read-ahead hints to give or take back; otherwise ranges a window at a time (a reused buffer, so
 * a large descriptor table is never held whole or faulted into fresh pages), with the kernel asked
 * to read ahead of the reader, and the kernel's own read-ahead stopped while the directory is read
 * so that it pulls no payload pages in behind it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/engine.h"
#include "source/source.h"
#include "base/sys.h"

/* A header prefix that grows to this size is read into a reservation (kiln__owned_reserve).
 * Grown through the allocator instead, each step's fresh block faulted in again on every open:
 * a 3,000-tensor GGUF file's header took 3.6-5.6 ms per open with the step at 1 MiB, 0.32 with
 * it here (a 6 MiB vocabulary: 4.6-7.0 against 1.5). */
#define PREFIX_RESERVE ((uint64_t)256 << 10)

struct map_state {
	uint8_t hdr[KILN__FIRST_BYTES]; /* the file's first bytes, read once */
	size_t hdr_len;
	/* transient fetches: one reused window */
	uint8_t *window;
	size_t window_cap;
	uint64_t window_off, window_len;
	/* a small cached directory read in one go: serves fetches of both kinds until close */
	uint8_t *whole;
	uint64_t whole_off, whole_len;
	/* prefix fetches: one buffer that grows */
	uint8_t *prefix;
	size_t prefix_cap;
	uint64_t prefix_len;
	int prefix_reserved; /* kiln__owned_reserve's, not the allocator's */
	uint64_t read_ahead; /* the kernel has been asked to read up to here */
	uint64_t expect_end; /* the reader said it reads below this */
	int decided;         /* expect has looked at the directory's residency */
	int dir_cached;      /* the directory is in the page cache: no hints needed */
	int ra_quiet;        /* POSIX_FADV_RANDOM is set during open and must be undone */
	int seq_position;    /* sequential advice on a cold directory: set the read position */
	int auto_pending;    /* KILN_SOURCE_AUTO: finish decides what to populate */
	void *map_addr;
	size_t map_len;
};

static struct map_state *state(const struct kiln__file *f)
{
	return f->src_state;
}

static int map_attach(struct kiln__file *f, const kiln_open_options *o, const void *buf, size_t len,
		      kiln_error *err)
{
	(void)buf, (void)len;
	struct map_state *s = kiln__alloc(f->alloc, sizeof(*s));
	if (!s)
		return kiln__nomem(err, sizeof(*s), "the file's state");
	memset(s, 0, sizeof(*s));
	f->src_state = s;
	s->auto_pending = o && o->source == KILN_SOURCE_AUTO;
	f->load.source = KILN_SOURCE_MMAP;
	int fd = kiln__file_open(f, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	/* The kernel's read-ahead would pull payload pages in behind the directory reads. A
	 * header page already in the page cache (the warm open) needs no hint to stop it: one
	 * cachestat here instead of fadvise calls took about 3 us off a warm 300-tensor open. */
	uint64_t page = kiln__page_size();
	s->dir_cached = kiln__span_cached(fd, 0, f->size < page ? f->size : page);
	if (!s->dir_cached)
		s->ra_quiet = !posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	return 0;
}

/* Ask the kernel to start reading [from, end) up to KILN__HEAD_READAHEAD past `from`, beyond
 * what has been asked for already. A hint: failure only costs speed. */
static void read_ahead(struct kiln__file *f, uint64_t from, uint64_t end)
{
	struct map_state *s = state(f);
	if (s->dir_cached)
		return;
	uint64_t to = from + KILN__HEAD_READAHEAD < end ? from + KILN__HEAD_READAHEAD : end;
	if (s->read_ahead > from)
		from = s->read_ahead;
	if (from >= to)
		return;
	posix_fadvise(f->fd, (off_t)from, (off_t)(to - from), POSIX_FADV_WILLNEED);
	s->read_ahead = to;
}

static void map_expect(struct kiln__file *f, uint64_t off, uint64_t end)
{
	struct map_state *s = state(f);
	if (end > s->expect_end)
		s->expect_end = end;
	if (!s->decided) {
		s->decided = 1;
		/* The header's page was cached; the directory is if the rest of it is too (the
		 * payload's residency does not matter). If not, the hints spared are needed. */
		uint64_t page = kiln__page_size();
		if (s->dir_cached && end > page && !kiln__span_cached(f->fd, page, end - page)) {
			s->dir_cached = 0;
			s->ra_quiet = !posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM);
		}
		s->seq_position = end > page && !s->dir_cached;
		/* A cached directory of at most KILN__HEAD_SMALL bytes in one read (a read per
		 * region cost about 1 us of a warm 300-tensor open). Without the memory, the
		 * usual reads. */
		if (s->dir_cached && end > off && end - off <= KILN__HEAD_SMALL) {
			size_t len = (size_t)(end - off);
			uint8_t *buf = kiln__alloc(f->alloc, len);
			if (buf && kiln__pread_full(f->fd, buf, len, off, NULL) == 0) {
				s->whole = buf;
				s->whole_off = off;
				s->whole_len = len;
				return;
			}
			if (buf)
				kiln__free(f->alloc, buf, len);
		}
	}
	read_ahead(f, off, end);
}

/* Fetch from the file into memory of the file's own: the header bytes, the whole small
 * directory, a kept copy, or the reused window. */
static const uint8_t *map_fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep,
				kiln_error *err)
{
	struct map_state *s = state(f);
	if (off + len <= KILN__FIRST_BYTES) {
		if (s->hdr_len < off + len) {
			size_t n =
			    f->size < KILN__FIRST_BYTES ? (size_t)f->size : KILN__FIRST_BYTES;
			if (kiln__pread_full(f->fd, s->hdr, n, 0, err))
				return NULL;
			s->hdr_len = n;
		}
		if (!keep)
			return s->hdr + off;
	}
	if (s->whole && off >= s->whole_off && off + len <= s->whole_off + s->whole_len)
		return s->whole + (off - s->whole_off);
	if (keep) {
		uint8_t *p = kiln__keep_alloc(f, (size_t)len, err);
		if (!p || kiln__pread_full(f->fd, p, (size_t)len, off, err))
			return NULL;
		return p;
	}
	if (len > s->window_cap) {
		/* Readers fetch at most KILN__HEAD_WINDOW transiently at a time; one size serves.
		 */
		size_t cap = len > KILN__HEAD_WINDOW ? (size_t)len : (size_t)KILN__HEAD_WINDOW;
		uint64_t room = f->size - off;
		if (cap > room && room >= len)
			cap = (size_t)room;
		uint8_t *w = kiln__alloc(f->alloc, cap);
		if (!w) {
			kiln__nomem(err, cap, "a directory window");
			return NULL;
		}
		if (s->window)
			kiln__free(f->alloc, s->window, s->window_cap);
		s->window = w;
		s->window_cap = cap;
		s->window_len = 0;
	}
	if (kiln__pread_full(f->fd, s->window, (size_t)len, off, err))
		return NULL;
	s->window_off = off;
	s->window_len = len;
	/* Keep the disk a read-ahead window ahead of the reader (cold opens). */
	read_ahead(f, off + len, s->expect_end > off + len ? s->expect_end : off + len);
	return s->window;
}

static void free_prefix(struct kiln__file *f, struct map_state *s)
{
	if (s->prefix_reserved)
		kiln__owned_unreserve(s->prefix, s->prefix_cap);
	else if (s->prefix)
		kiln__free(f->alloc, s->prefix, s->prefix_cap);
	s->prefix = NULL;
}

static const uint8_t *map_prefix(struct kiln__file *f, uint64_t len, kiln_error *err)
{
	struct map_state *s = state(f);
	if (!s->prefix && s->whole && s->whole_off == 0 && len <= s->whole_len)
		return s->whole; /* the small cached header, read already */
	if (len > s->prefix_len) {
		if (len > s->prefix_cap) {
			/* Grow by at least half again: a header read in pieces is copied a bounded
			 * number of times. */
			uint64_t cap = s->prefix_cap + s->prefix_cap / 2;
			if (cap < len)
				cap = len;
			if (cap > f->size)
				cap = f->size;
			/* A large header (a vocabulary, a 100,000-tensor index) goes into address
			 * space reserved for the whole file: it never moves again, and the huge
			 * pages of the blocks it fills fault once per 2 MiB, where fresh 4 KiB
			 * pages fault each (on a VM, 6 MiB read into those took 17 ms against 0.8).
			 */
			int reserved = cap >= PREFIX_RESERVE;
			uint8_t *p = reserved ? kiln__owned_reserve((size_t)f->size) : NULL;
			if (p)
				cap = f->size;
			else
				p = kiln__alloc(f->alloc, (size_t)cap), reserved = 0;
			if (!p) {
				kiln__nomem(err, (size_t)cap, "a copy of the header");
				return NULL;
			}
			if (s->prefix) {
				memcpy(p, s->prefix, (size_t)s->prefix_len);
				free_prefix(f, s);
			}
			s->prefix = p;
			s->prefix_cap = (size_t)cap;
			s->prefix_reserved = reserved;
		}
		/* Huge pages for the blocks this read fills whole, small pages for the rest: a
		 * 300 KB header costs 300 KB, not a 2 MiB page. */
		if (s->prefix_reserved)
			kiln__owned_reserve_huge(s->prefix, (size_t)s->prefix_len, (size_t)len);
		if (kiln__pread_full(f->fd, s->prefix + s->prefix_len,
				     (size_t)(len - s->prefix_len), s->prefix_len, err))
			return NULL;
		s->prefix_len = len;
		read_ahead(f, len, s->expect_end > len ? s->expect_end : len);
	}
	return s->prefix;
}

/* A reserved prefix's small pages past the header go back to the system: GGUF's reader grows
 * the prefix by doubling, so a 137 KiB header was held in 256 KiB. (A huge page there is only
 * split, its memory freed when the kernel gets to it; below PREFIX_RESERVE the allocator's
 * block stays: at most as much again of a small header.) */
static void map_prefix_keep(struct kiln__file *f, uint64_t len)
{
	struct map_state *s = state(f);
	if (!s->prefix_reserved || len >= s->prefix_len)
		return;
	size_t page = kiln__page_size(), from = ((size_t)len + page - 1) & ~(page - 1),
	       to = ((size_t)s->prefix_len + page - 1) & ~(page - 1);
	if (to > from)
		(void)madvise(s->prefix + from, to - from, MADV_DONTNEED);
	s->prefix_len = len;
}

static const int advice_of[] = {
    [KILN_ADVICE_NORMAL] = MADV_NORMAL,
    [KILN_ADVICE_SEQUENTIAL] = MADV_SEQUENTIAL,
    [KILN_ADVICE_RANDOM] = MADV_RANDOM,
    [KILN_ADVICE_WILLNEED] = MADV_WILLNEED,
};

/* Fault every page in: MADV_POPULATE_READ where the kernel has it, else one read per page. Only
 * a kernel without it (EINVAL) gets the loop: any other failure (EFAULT for a file that shrank)
 * would turn into SIGBUS there. */
static void populate(const uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_READ
	if (madvise((void *)p, len, MADV_POPULATE_READ) == 0 || errno != EINVAL)
		return;
#endif
	volatile uint8_t sink = 0;
	size_t page = kiln__page_size();
	for (size_t i = 0; i < len; i += page)
		sink ^= p[i];
	(void)sink;
}

/* The mapping's pages told to f->landed a block at a time, each faulted in just before
 * (MADV_POPULATE_READ), so that checking them is the populate: one pass over the file. A file
 * that shrank since open is IO here, never SIGBUS; a kernel without the call (EINVAL) gets its
 * pages faulted by the check itself. */
#define LANDED_BLOCK ((size_t)2 << 20)

static int walk_landed(struct kiln__file *f, kiln_error *err)
{
	const struct map_state *s = state(f);
	uint8_t *base = s->map_addr;
	for (size_t off = 0; off < s->map_len; off += LANDED_BLOCK) {
		size_t len = s->map_len - off < LANDED_BLOCK ? s->map_len - off : LANDED_BLOCK;
#ifdef MADV_POPULATE_READ
		if (madvise(base + off, len, MADV_POPULATE_READ) && errno != EINVAL) {
			int e = errno;
			return kiln__fail_sys(
			    err, KILN_IO, e,
			    "%s: bytes %zu..%zu cannot be read through the mapping "
			    "(%s): the file changed since open",
			    kiln__file_shown(f), off, off + len, strerror(e));
		}
#endif
		int rc = f->landed(f->landed_ctx, off, len, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* KILN_SOURCE_AUTO's evidence: AUTO_WINDOWS windows of AUTO_PAGES pages, evenly spread from the
 * start of the payload to the end of the file (the directory was just read, so its pages say
 * nothing about the payload's). */
#define AUTO_WINDOWS 8
#define AUTO_PAGES   16

/* Whether pages [at, at + n) of the mapping are all in the page cache. */
static int resident(const struct map_state *s, size_t at, size_t n, unsigned char *vec)
{
	size_t page = kiln__page_size();
	if (mincore((uint8_t *)s->map_addr + at * page, n * page, vec))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(vec[i] & 1))
			return 0;
	return 1;
}

static int sampled_all_cached(const struct kiln__file *f)
{
	const struct map_state *s = state(f);
	size_t page = kiln__page_size();
	size_t first = (size_t)f->payload_base / page, pages = (s->map_len + page - 1) / page;
	if (first >= pages)
		first = 0;
	size_t span = pages - first;
	unsigned char vec[AUTO_WINDOWS * AUTO_PAGES];
	if (span <= sizeof(vec)) /* a small file: every page, in one call */
		return resident(s, first, span, vec);
	/* Windows from the payload's first pages to the file's last ones, evenly apart. */
	for (size_t w = 0; w < AUTO_WINDOWS; w++)
		if (!resident(s, first + (span - AUTO_PAGES) * w / (AUTO_WINDOWS - 1), AUTO_PAGES,
			      vec))
			return 0;
	return 1;
}

/* KILN_SOURCE_AUTO on a mapped file: whether to populate it. */
static uint32_t auto_flags(struct kiln__file *f, uint32_t flags)
{
	if (sampled_all_cached(f)) {
		/* Mapping cached pages at open reads nothing from the disk and, on the large folios
		 * a read from disk leaves, beats faulting them in later by 3x (warm 1 GiB: 1.9 ms
		 * against 5-6 ms); on a file just written (small folios) touching ran faster
		 * (8.3 against 10.8 ms for 256 MiB), which no cheap evidence here can tell. */
		f->load.auto_choice = KILN_AUTO_CACHED;
		return flags | KILN_OPEN_POPULATE;
	}
	uint64_t avail = kiln__sys.mem_available();
	if (avail && (uint64_t)state(f)->map_len > avail / 2) {
		f->load.auto_choice = KILN_AUTO_LARGE;
		return flags;
	}
	f->load.auto_choice = KILN_AUTO_COLD;
	return flags | KILN_OPEN_POPULATE;
}

/* The directory's reads are done: give the read-ahead back, and set the read position for a
 * sequential mapping. */
static void end_directory(struct kiln__file *f, const kiln_open_options *o)
{
	struct map_state *s = state(f);
	if (s->ra_quiet)
		posix_fadvise(f->fd, 0, 0, POSIX_FADV_NORMAL);
	s->ra_quiet = 0;
	/* Under MADV_SEQUENTIAL a fault that misses gets the kernel's sequential read-ahead (a
	 * window with an asynchronous marker, so the next window is read while this one is used)
	 * only when the miss follows the file's last read position; otherwise one window is read
	 * synchronously and the faults stall again at the next. The directory's reads end
	 * wherever validation left them, so a cold 1 GiB touched through a sequential mapping
	 * took 0.9-1.0 s where one with no advice took 0.55. A 1-byte read of the directory's last
	 * byte (cached by now) puts the position where the payload starts. */
	if (o && o->advice == KILN_ADVICE_SEQUENTIAL && s->seq_position && f->payload_base) {
		uint8_t last;
		(void)kiln__sys.pread(f->fd, &last, 1, (off_t)f->payload_base - 1);
	}
}

/* Drop what only open needed. */
static void free_buffers(struct kiln__file *f)
{
	struct map_state *s = state(f);
	if (s->window)
		kiln__free(f->alloc, s->window, s->window_cap);
	s->window = NULL;
	s->window_cap = 0;
}

/* Everything the state holds but the header copies the views point into. */
static void release_but_header(struct kiln__file *f, struct map_state *s)
{
	if (s->ra_quiet)
		posix_fadvise(f->fd, 0, 0, POSIX_FADV_NORMAL);
	s->ra_quiet = 0;
	free_buffers(f);
	if (s->map_addr)
		munmap(s->map_addr, s->map_len);
	s->map_addr = NULL;
}

/* The state with what is left of it once its buffers and mapping are gone: the header copies. */
static void free_held(struct kiln__file *f, void *held)
{
	struct map_state *s = held;
	if (s->whole)
		kiln__free(f->alloc, s->whole, (size_t)s->whole_len);
	free_prefix(f, s);
	kiln__free(f->alloc, s, sizeof(*s));
}

static int map_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	struct map_state *s = state(f);
	end_directory(f, o);
	free_buffers(f);
	if (f->size == 0)
		return 0; /* an empty file (a format that allows it): nothing to map */
	/* Copy-on-write needs no write access to the file: pages are copied when written. No
	 * reservation, or a model larger than memory could not be mapped (see kiln.h). */
	uint32_t flags = o ? o->flags : 0;
	int cow = (flags & KILN_OPEN_PRIVATE) != 0;
	void *p = kiln__sys.mmap(NULL, (size_t)f->size, cow ? PROT_READ | PROT_WRITE : PROT_READ,
				 cow ? MAP_PRIVATE | MAP_NORESERVE : MAP_SHARED, f->fd, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		if (s->auto_pending && e == ENODEV) {
			/* AUTO on a file system that cannot map files: read it instead. The views'
			 * names and key/values point into the header copies: they stay until close.
			 */
			release_but_header(f, s);
			f->held = s;
			f->held_release = free_held;
			f->src_state = NULL;
			f->load.auto_choice = KILN_AUTO_UNMAPPABLE;
			return kiln__read_takeover(f, o, err);
		}
		return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e,
				      "%s: cannot map: %s", f->path, strerror(e));
	}
	s->map_addr = p;
	s->map_len = (size_t)f->size;
	f->base = p;
	if (s->auto_pending)
		flags = auto_flags(f, flags);
	unsigned advice = o ? o->advice : KILN_ADVICE_NORMAL;
	/* NORMAL is what a new mapping has: no call needed. */
	if (advice != KILN_ADVICE_NORMAL && madvise(p, s->map_len, advice_of[advice]))
		f->load.advice_errno = errno;
	if ((flags & KILN_OPEN_HUGEPAGE) && madvise(p, s->map_len, MADV_HUGEPAGE))
		f->load.advice_errno = errno;
	if (flags & KILN_OPEN_LOCK) {
		if (kiln__sys.mlock(p, s->map_len) != 0)
			return kiln__mlock_fail(err, errno, s->map_len);
	} else if ((flags & KILN_OPEN_POPULATE) && !f->landed) {
		populate(p, s->map_len); /* else the walk below populates */
	}
	return f->landed ? walk_landed(f, err) : 0;
}

static void map_release(struct kiln__file *f)
{
	struct map_state *s = state(f);
	if (!s)
		return;
	release_but_header(f, s);
	free_held(f, s);
	f->src_state = NULL;
}

/* Through the file, not the mapping: a file truncated under us is an error, not SIGBUS. */
static int map_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		    kiln_error *err)
{
	return kiln__pread_full(f->fd, dst, len, off, err);
}

static int map_hint(const struct kiln__file *f, void *p, size_t len, unsigned hint)
{
	(void)f;
	static const int advice[] = {
	    [KILN_HINT_WILLNEED] = MADV_WILLNEED,
	    [KILN_HINT_DONTNEED] = MADV_DONTNEED,
	    [KILN_HINT_COLD] = MADV_COLD,
	    [KILN_HINT_PAGEOUT] = MADV_PAGEOUT,
	};
	return madvise(p, len, advice[hint]) ? errno : 0;
}

const struct kiln__source kiln__source_map = {
    .id = KILN_SOURCE_MMAP,
    .attach = map_attach,
    .fetch = map_fetch,
    .prefix = map_prefix,
    .prefix_keep = map_prefix_keep,
    .expect = map_expect,
    .finish = map_finish,
    .release = map_release,
    .read = map_read,
    .feed = kiln__feed_local,
    .advise = kiln__advise_local,
    .beside = kiln__beside_local,
    .hint = map_hint,
    .pinnable = 1,
};
