/* SPDX-License-Identifier: MIT */
/*
 * The lifecycle of a directory, on top of everything else in src/: options, open (a file through
 * a source) and parse (a caller's buffer), payload verification, close and try_close.
 *
 * Opening a file: read and check the 64-byte header with pread, then feed the validator from the
 * file a window at a time (for READ/URING into the block's own memory; for MMAP the descriptors
 * through one reused window and the name heap into a copy, since names point into it), and only
 * then let the source finish (advice and populate for a mapping, the payload reads for owned
 * memory). The validator never reads a mapping, so a file that shrinks during open gives IO or
 * a format error, never SIGBUS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "source.h"
#include "sys.h"

static int check_options(const kiln_open_options *opts, kiln_error *err)
{
	if (!opts)
		return 0;
	if (opts->size != 0 && opts->size < sizeof(*opts))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "size",
		    "kiln_open_options.size %u is smaller than this version's %zu", opts->size,
		    sizeof(*opts));
	const uint32_t known = KILN_OPEN_VERIFY_PAYLOAD | KILN_OPEN_ALLOW_TRAILING |
			       KILN_OPEN_POPULATE | KILN_OPEN_LOCK | KILN_OPEN_HUGEPAGE |
			       KILN_OPEN_DIRECT | KILN_OPEN_PRIVATE;
	if (opts->flags & ~known)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown open flags 0x%x",
					opts->flags & ~known);
	/* Every page of a writable private mapping is copied when it is locked. */
	if ((opts->flags & KILN_OPEN_PRIVATE) && (opts->flags & KILN_OPEN_LOCK))
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags",
					"KILN_OPEN_PRIVATE with KILN_OPEN_LOCK would copy every "
					"page of the file into memory");
	if (opts->source > KILN_SOURCE_AUTO)
		return kiln__fail_inval(err, KILN_NO_INDEX, "source", "unknown source %u",
					opts->source);
	if (opts->advice > KILN_ADVICE_WILLNEED)
		return kiln__fail_inval(err, KILN_NO_INDEX, "advice", "unknown advice %u",
					opts->advice);
	if (opts->chunk_size > KILN__CHUNK_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "chunk_size",
					"chunk_size %u is above 1 GiB", opts->chunk_size);
	if (opts->queue_depth > KILN__QD_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "queue_depth",
					"queue_depth %u is above %u", opts->queue_depth,
					KILN__QD_MAX);
	if (opts->threads > KILN__THREADS_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "threads", "threads %u is above %u",
					opts->threads, KILN__THREADS_MAX);
	if (opts->reserved32)
		return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
					"kiln_open_options.reserved32 is not 0");
	for (size_t i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
						"kiln_open_options.reserved[%zu] is not 0", i);
	const kiln_allocator *a = opts->allocator;
	if (a && (!a->alloc || !a->free))
		return kiln__fail_inval(err, KILN_NO_INDEX, "allocator",
					"an allocator needs both alloc and free");
	return 0;
}

struct kiln_dir *kiln__dir_new(const kiln_open_options *opts, kiln_error *err)
{
	kiln_allocator a = kiln__default_allocator;
	if (opts && opts->allocator)
		a = *opts->allocator;
	struct kiln_dir *dir = a.alloc(a.ctx, sizeof(*dir));
	if (!dir) {
		kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate a directory handle");
		return NULL;
	}
	memset(dir, 0, sizeof(*dir));
	dir->alloc = a;
	dir->fd = -1;
	kiln__hash_key(dir->secret);
	return dir;
}

static void window_free(struct kiln_dir *dir)
{
	if (dir->window)
		kiln__free(&dir->alloc, dir->window, dir->window_cap);
	dir->window = NULL;
	dir->window_cap = 0;
	dir->window_len = 0;
}

void kiln_dir_close(kiln_dir *dir)
{
	if (!dir)
		return;
	/* Registrations first: no pin hook may outlive the memory it registered. */
	kiln__pins_release(dir);
	kiln__index_free(dir);
	kiln__map_release(dir);
	kiln__read_release(dir);
	window_free(dir);
	if (dir->heap_copy)
		kiln__free(&dir->alloc, dir->heap_copy, dir->heap_copy_len);
	if (dir->fd >= 0)
		close(dir->fd);
	kiln_allocator a = dir->alloc;
	a.free(a.ctx, dir, sizeof(*dir));
}

int kiln_dir_try_close(kiln_dir *dir, kiln_error *err)
{
	kiln__clear_error(err);
	if (dir && dir->info.pinned)
		return kiln__fail(err, KILN_BUSY, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "%" PRIu32 " pinned range(s) are still registered; unpin them "
				  "first",
				  dir->info.pinned);
	kiln_dir_close(dir);
	return 0;
}

/* Verification reads a file through pread, never a mapping: a file truncated under an open
 * directory gives IO, not SIGBUS. Owned and borrowed memory is read in place. */
static int read_block(const struct kiln_dir *dir, uint64_t off, void *buf, size_t len,
		      kiln_error *err)
{
	if (dir->info.source == KILN_SOURCE_MMAP)
		return kiln__pread_full(dir->fd, buf, len, off, err);
	memcpy(buf, dir->base + off, len);
	return 0;
}

int kiln_dir_verify_payload(const kiln_dir *dir, kiln_error *err)
{
	kiln__clear_error(err);
	if (!dir)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "dir is NULL");
	/* A cached result, not a change to the directory: threads verifying at once compute the
	 * same answer, and the flag is only ever read and written atomically. */
	int *verified = (int *)&dir->verified;
	if (__atomic_load_n(verified, __ATOMIC_ACQUIRE))
		return 0;
	int rc = kiln__verify_payload(dir, read_block, err);
	if (!rc)
		__atomic_store_n(verified, 1, __ATOMIC_RELEASE);
	return rc;
}

/* The last step of open and parse: verification when asked, then hand the directory out, or
 * release it on any failure (rc from the steps before). */
static int finish_open(struct kiln_dir *dir, const kiln_open_options *opts, int rc, kiln_dir **out,
		       kiln_error *err)
{
	if (!rc && opts && (opts->flags & KILN_OPEN_VERIFY_PAYLOAD))
		rc = kiln_dir_verify_payload(dir, err);
	if (rc) {
		kiln_dir_close(dir);
		return rc;
	}
	*out = dir;
	return 0;
}

int kiln_dir_parse(const void *buf, size_t len, const kiln_open_options *opts, kiln_dir **out,
		   kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "out is NULL");
	*out = NULL;
	if (!buf && len)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"buf is NULL with a nonzero length");
	int rc = check_options(opts, err);
	if (rc)
		return rc;
	if (opts && (opts->flags & KILN_OPEN_PRIVATE))
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags",
					"KILN_OPEN_PRIVATE applies to mapped files; a borrowed "
					"buffer is the caller's to copy");
	struct kiln_dir *dir = kiln__dir_new(opts, err);
	if (!dir)
		return KILN_NOMEM;
	static const uint8_t empty[1];
	dir->base = buf ? buf : empty;
	dir->head = dir->base;
	dir->len = len;
	dir->info.source = KILN_SOURCE_BUFFER;
	int exact = !(opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING));
	rc = kiln__validate_structure(dir, exact, err);
	return finish_open(dir, opts, rc, out, err);
}

int kiln_validate(const void *buf, size_t len, uint32_t flags, kiln_error *err)
{
	kiln_open_options o = {.size = sizeof(o), .flags = flags};
	kiln_dir *dir;
	int rc = kiln_dir_parse(buf, len, &o, &dir, err);
	kiln_dir_close(dir);
	return rc;
}

static int sys_fail(kiln_error *err, const char *path, const char *what, int e)
{
	return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e, "%s: %s: %s", path, what,
			      strerror(e));
}

/* Open `path` read-only and check it is a regular file. Returns the descriptor or -1. */
static int open_file(const char *path, uint64_t *size, kiln_error *err)
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

/* The end of the next read-ahead window from `from`, for a request ending at `want`, within a
 * region ending at `end`. */
static uint64_t window_end(uint64_t from, uint64_t want, uint64_t end)
{
	uint64_t to = want - from < KILN__HEAD_READAHEAD ? from + KILN__HEAD_READAHEAD : want;
	return to < end ? to : end;
}

/* Read the file's [off, to) of region r into dst, a region that fills in order. */
static int fill_region(struct kiln_dir *dir, int r, uint8_t *dst, uint64_t to, kiln_error *err)
{
	uint64_t from = dir->filled[r];
	int rc = kiln__pread_full(dir->fd, dst, (size_t)(to - from), from, err);
	if (!rc)
		dir->filled[r] = to;
	return rc;
}

/* dir->fetch for READ/URING: the block memory is the directory's home; fill it in order within
 * each region (the descriptor table; the heap and pad), a window at a time. */
static const uint8_t *fetch_owned(struct kiln_dir *dir, uint64_t off, uint64_t len, kiln_error *err)
{
	uint64_t heap = KILN__HEADER_SIZE + (uint64_t)dir->info.tensor_count * KILN__DESC_SIZE;
	int r = off >= heap;
	uint8_t *head = (uint8_t *)dir->head;
	uint64_t from = dir->filled[r], want = off + len;
	if (want > from &&
	    fill_region(dir, r, head + from,
			window_end(from, want, r ? dir->info.payload_base : heap), err))
		return NULL;
	return head + off;
}

/* Ask the kernel to start reading the file's [from, end) up to KILN__HEAD_READAHEAD past `from`,
 * beyond what has been asked for already. A hint: failure only costs speed. */
static void read_ahead(struct kiln_dir *dir, uint64_t from, uint64_t end)
{
	if (dir->dir_cached)
		return;
	uint64_t to = from + KILN__HEAD_READAHEAD < end ? from + KILN__HEAD_READAHEAD : end;
	if (dir->read_ahead > from)
		from = dir->read_ahead;
	if (from >= to)
		return;
	posix_fadvise(dir->fd, (off_t)from, (off_t)(to - from), POSIX_FADV_WILLNEED);
	dir->read_ahead = to;
}

/* dir->fetch for MMAP: the header from hdr; descriptors through one reused window, so the
 * table is never held whole; the heap and pad from a copy filled in order (names point into
 * it). Nothing is read through the mapping. Buffers are allocated at first use, after the
 * validator has allocated the index: a count the allocator refuses costs nothing more. */
static const uint8_t *fetch_mapped(struct kiln_dir *dir, uint64_t off, uint64_t len,
				   kiln_error *err)
{
	uint64_t heap = KILN__HEADER_SIZE + (uint64_t)dir->info.tensor_count * KILN__DESC_SIZE;
	if (off + len <= KILN__HEADER_SIZE)
		return dir->hdr + off;
	if (off >= heap) {
		uint64_t region = dir->info.payload_base - heap;
		if (!dir->heap_copy) {
			dir->heap_copy = kiln__alloc(&dir->alloc, (size_t)region);
			if (!dir->heap_copy) {
				kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					       "cannot allocate %" PRIu64
					       " bytes for a copy of the name heap",
					       region);
				return NULL;
			}
			dir->heap_copy_len = (size_t)region;
		}
		uint64_t from = dir->filled[1], want = off + len;
		if (want > from) {
			uint64_t to = window_end(from, want, dir->info.payload_base);
			uint8_t *dst = dir->heap_copy + (from - heap);
			if (dir->window && from >= dir->window_off &&
			    to <= dir->window_off + dir->window_len) {
				/* read_directory's first read already holds it */
				memcpy(dst, dir->window + (from - dir->window_off),
				       (size_t)(to - from));
				dir->filled[1] = to;
			} else if (fill_region(dir, 1, dst, to, err)) {
				return NULL;
			}
		}
		return dir->heap_copy + (off - heap);
	}
	if (off < dir->window_off || off + len > dir->window_off + dir->window_len) {
		if (!dir->window) {
			uint64_t table = heap - KILN__HEADER_SIZE;
			size_t cap =
			    (size_t)(table < KILN__HEAD_WINDOW ? table : KILN__HEAD_WINDOW);
			dir->window = kiln__alloc(&dir->alloc, cap);
			if (!dir->window) {
				kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					       "cannot allocate a %zu-byte directory window", cap);
				return NULL;
			}
			dir->window_cap = cap;
		}
		/* Whole descriptors: off is a descriptor's start and the window a multiple of 128.
		 */
		uint64_t n = heap - off < dir->window_cap ? heap - off : dir->window_cap;
		if (kiln__pread_full(dir->fd, dir->window, (size_t)n, off, err))
			return NULL;
		dir->window_off = off;
		dir->window_len = n;
		/* Keep the disk a read-ahead window ahead of the validator (cold opens). */
		read_ahead(dir, off + n, heap);
	}
	return dir->window + (off - dir->window_off);
}

/* A cached directory of at most KILN__HEAD_SMALL bytes past the header: descriptors and heap in
 * one read, which is fetch_mapped's only window and the source of its heap copy (a read each
 * cost about 1 us of a warm 300-tensor open). Without the memory, the usual reads. */
static int read_rest_whole(struct kiln_dir *dir, kiln_error *err)
{
	size_t len = (size_t)(dir->info.payload_base - KILN__HEADER_SIZE);
	uint8_t *buf = kiln__alloc(&dir->alloc, len);
	if (!buf)
		return 0;
	int rc = kiln__pread_full(dir->fd, buf, len, KILN__HEADER_SIZE, err);
	if (rc) {
		kiln__free(&dir->alloc, buf, len);
		return rc;
	}
	dir->window = buf;
	dir->window_cap = len;
	dir->window_off = KILN__HEADER_SIZE;
	dir->window_len = len;
	return 0;
}

/* The header, checked; then memory for the directory from the source (a READ/URING block) or a
 * header copy (MMAP), and the validator fed from the file. */
static int read_directory(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
			  kiln_error *err)
{
	size_t hlen = dir->len < sizeof(dir->hdr) ? (size_t)dir->len : sizeof(dir->hdr);
	int rc = kiln__pread_full(dir->fd, dir->hdr, hlen, 0, err);
	if (rc)
		return rc;
	dir->head = dir->hdr;
	rc = kiln__check_header(dir, 1, err);
	if (rc)
		return rc;
	dir->filled[0] = KILN__HEADER_SIZE;
	dir->filled[1] = KILN__HEADER_SIZE + (uint64_t)dir->info.tensor_count * KILN__DESC_SIZE;
	/* load_file found the header's page cached; the directory is cached if the rest of it is
	 * too (the payload's residency does not matter). If not, the hints it spared are needed
	 * after all. */
	uint64_t base = dir->info.payload_base, page = kiln__page_size();
	if (dir->dir_cached && base > page && !kiln__span_cached(dir->fd, page, base - page)) {
		dir->dir_cached = 0;
		dir->ra_quiet = !posix_fadvise(dir->fd, 0, 0, POSIX_FADV_RANDOM);
	}
	/* A sequential mapping of a file whose directory is not all cached: its payload is likely
	 * cold too, and the read position matters. */
	if (dir->info.source == KILN_SOURCE_MMAP && opts &&
	    opts->advice == KILN_ADVICE_SEQUENTIAL && base > page)
		dir->seq_position = !dir->dir_cached;
	if (dir->info.source == KILN_SOURCE_MMAP) {
		rc = kiln__map_attach(dir, opts, path, err);
		if (rc && dir->auto_pending && dir->map_errno == ENODEV) {
			/* AUTO on a file system that cannot map files: read it instead. */
			window_free(dir);
			kiln__clear_error(err);
			dir->auto_pending = 0;
			dir->info.auto_choice = KILN_AUTO_UNMAPPABLE;
			dir->info.source = KILN_SOURCE_READ;
			return read_directory(dir, opts, path, err);
		}
		dir->fetch = fetch_mapped;
		uint64_t rest = dir->info.payload_base - KILN__HEADER_SIZE;
		if (!rc && dir->dir_cached && rest && rest <= KILN__HEAD_SMALL)
			rc = read_rest_whole(dir, err);
		/* The heap first (where a large table ends), then the table's start: one read each
		 * in flight before the first descriptor is asked for. */
		uint64_t heap = dir->filled[1];
		read_ahead(dir, heap, dir->info.payload_base);
		dir->read_ahead = 0;
		read_ahead(dir, KILN__HEADER_SIZE, heap);
	} else {
		/* payload_base <= the file's length is proven: the block memory holds it. */
		rc = kiln__read_attach(dir, opts, err);
		if (!rc)
			memcpy((uint8_t *)dir->head, dir->hdr, sizeof(dir->hdr));
		dir->fetch = fetch_owned;
	}
	if (!rc)
		rc = kiln__validate_structure(dir, 1, err);
	dir->fetch = NULL;
	window_free(dir);
	return rc;
}

static int load_file(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		     kiln_error *err)
{
	if (dir->info.source != KILN_SOURCE_MMAP) {
		int rc = read_directory(dir, opts, path, err);
		return rc ? rc : kiln__read_payload(dir, opts, err);
	}
	/* The kernel's read-ahead would pull payload pages in behind the directory reads, and the
	 * mapping's open reads only what it validates. A hint, taken back before the caller's
	 * advice and populate. A directory already in the page cache (the warm open) is read with
	 * no read-ahead to stop and none to start: cachestat of the header's page here and of the
	 * rest of the directory once the header gives its length (read_directory), instead of
	 * four fadvise calls, took about 3 us off a warm 300-tensor open. */
	uint64_t page = kiln__page_size();
	dir->dir_cached = kiln__span_cached(dir->fd, 0, dir->len < page ? dir->len : page);
	if (!dir->dir_cached)
		dir->ra_quiet = !posix_fadvise(dir->fd, 0, 0, POSIX_FADV_RANDOM);
	int rc = read_directory(dir, opts, path, err);
	if (dir->ra_quiet)
		posix_fadvise(dir->fd, 0, 0, POSIX_FADV_NORMAL);
	/* Under MADV_SEQUENTIAL a fault that misses gets the kernel's sequential read-ahead (a
	 * window with an asynchronous marker, so the next window is read while this one is used)
	 * only when the miss follows the file's last read position; otherwise one window is read
	 * synchronously and the faults stall again at the next. The directory's reads end
	 * wherever validation left them, so a cold 1 GiB touched through a sequential mapping
	 * took 0.9-1.0 s where one with no advice took 0.55. A 1-byte read of the directory's last
	 * byte (cached by now) puts the position where the payload starts. */
	if (!rc && dir->seq_position) {
		uint8_t last;
		(void)kiln__sys.pread(dir->fd, &last, 1, (off_t)dir->info.payload_base - 1);
	}
	if (!rc && dir->info.source != KILN_SOURCE_MMAP) /* AUTO fell back to READ */
		return kiln__read_payload(dir, opts, err);
	return rc ? rc : kiln__map_finish(dir, opts, err);
}

int kiln_dir_open(const char *path, const kiln_open_options *opts, kiln_dir **out, kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "out is NULL");
	*out = NULL;
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	int rc = check_options(opts, err);
	if (rc)
		return rc;
	unsigned source = opts ? opts->source : KILN_SOURCE_MMAP;
	uint32_t auto_choice = KILN_AUTO_NONE;
	if (source == KILN_SOURCE_AUTO) {
		/* Owned bytes asked for in so many words: io_uring, the faster owned load. Else a
		 * mapping, and the rest is decided once it exists (kiln__map_finish). */
		int owned = opts->buffer || (opts->flags & KILN_OPEN_DIRECT);
		source = owned ? KILN_SOURCE_URING : KILN_SOURCE_MMAP;
		auto_choice = owned ? KILN_AUTO_OWNED : KILN_AUTO_NONE;
	}
	if (opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_OPEN_ALLOW_TRAILING applies to buffers; a file is one block");
	if (opts && opts->buffer && source == KILN_SOURCE_MMAP)
		return kiln__fail_inval(err, KILN_NO_INDEX, "buffer",
					"a load buffer needs the read or uring source");
	if (source == KILN_SOURCE_BUFFER)
		return kiln__fail_inval(err, KILN_NO_INDEX, "source",
					"source %u cannot open a path (use mmap, read or uring)",
					source);

	uint64_t size;
	int fd = open_file(path, &size, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	struct kiln_dir *dir = kiln__dir_new(opts, err);
	if (!dir) {
		close(fd);
		return KILN_NOMEM;
	}
	dir->fd = fd;
	dir->len = size;
	dir->info.source = source;
	dir->info.auto_choice = auto_choice;
	dir->auto_pending = opts && opts->source == KILN_SOURCE_AUTO && source == KILN_SOURCE_MMAP;
	rc = load_file(dir, opts, path, err);
	return finish_open(dir, opts, rc, out, err);
}
