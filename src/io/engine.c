/* SPDX-License-Identifier: MIT */
/*
 * The chunked read engine: ranges of a file split into chunks (aligned to absolute file offsets,
 * so O_DIRECT needs a bounce buffer only for a range's first and last chunk), read with io_uring
 * (up to qd in flight) or pread (one call at a time: neighbouring chunks of one window together
 * with preadv when they go to the caller's memory), into the caller's memory or a ring of staging
 * buffers. EINTR, EAGAIN and short reads are retried; EINVAL under O_DIRECT switches to buffered
 * reads; a file that ends early is EIO. On any stop every read in flight is reaped before return,
 * so nothing writes into caller memory afterwards.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "io/engine.h"
#include "base/sys.h"

/* io_uring writes into our buffers behind valgrind's back; tell memcheck what landed so a
 * valgrind run of the tests sees defined bytes. A no-op outside valgrind. */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define MARK_DEFINED(p, n) VALGRIND_MAKE_MEM_DEFINED(p, n)
#endif
#endif
#ifndef MARK_DEFINED
#define MARK_DEFINED(p, n) ((void)0)
#endif

struct slot {
	int busy;
	uint64_t off; /* the chunk: file offset, length, destination */
	uint64_t len;
	uint8_t *dst;
	uint64_t tensor;
	uint64_t tensor_off;
	uint32_t file;   /* the range's file */
	uint32_t buffer; /* staging buffer, or UINT32_MAX */
	uint64_t slack;  /* writable bytes past dst + len */
	/* the read issued for it */
	int fd;
	int is_direct;
	uint8_t *rbuf;
	uint64_t roff;
	uint64_t rlen;
	uint64_t done;
	uint8_t *bounce; /* chunk + 2 * alignment, page aligned; NULL unless direct */
};

struct run {
	struct kiln__io *io;
	const struct kiln__range *ranges;
	size_t n;
	size_t next_range; /* chunk generator */
	uint64_t next_pos;
	int *dfds; /* O_DIRECT descriptor of each file; NULL when not direct */
	uint32_t nfiles;
	int direct_ok; /* cleared when the file system refuses a direct read */
	size_t bounce_size;
	uint32_t A;  /* O_DIRECT file offset alignment */
	uint32_t MA; /* O_DIRECT memory alignment */
	struct slot *slots;
	uint32_t nslots;
	uint32_t next_buffer;
	uint8_t *buffer_used; /* staging: has been filled before (before_reuse is due) */
	uint8_t *buffer_busy;
	int stop; /* a kiln_code once something failed or a callback said stop */
	kiln_error *err;
};

int kiln__file_ended(kiln_error *err, int fd, uint64_t at, uint64_t missing)
{
	/* Where the file ends now, which a truncation moved: the true end, not where the read
	 * that found it out began. */
	struct stat st;
	uint64_t end = fstat(fd, &st) == 0 && st.st_size >= 0 ? (uint64_t)st.st_size : at;
	if (end > at)
		end = at;
	kiln__fail_sys(err, KILN_IO, EIO,
		       "the file ended at byte %" PRIu64 " (truncated after open?): the %" PRIu64
		       " bytes wanted at %" PRIu64 " are not there",
		       end, missing, at);
	if (err)
		err->offset = end;
	return KILN_IO;
}

int kiln__pread_full(int fd, void *dst, size_t len, uint64_t off, kiln_error *err)
{
	uint8_t *p = dst;
	size_t done = 0;
	while (done < len) {
		ssize_t r = kiln__sys.pread(fd, p + done, len - done, (off_t)(off + done));
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			int e = errno;
			return kiln__fail_sys(err, KILN_IO, e,
					      "read of %zu bytes at offset %" PRIu64 " failed: %s",
					      len - done, off + done, strerror(e));
		}
		if (r == 0)
			return kiln__file_ended(err, fd, off + done, len - done);
		done += (size_t)r;
	}
	return 0;
}

static int next_chunk(struct run *r, struct slot *s)
{
	while (r->next_range < r->n && r->next_pos >= r->ranges[r->next_range].len) {
		r->next_range++;
		r->next_pos = 0;
	}
	if (r->next_range >= r->n)
		return 0;
	const struct kiln__range *g = &r->ranges[r->next_range];
	uint64_t abs = g->off + r->next_pos;
	uint64_t end = g->off + g->len;
	uint64_t chunk = r->io->staging ? r->io->staging_size : r->io->chunk;
	/* Boundaries at absolute multiples of the chunk (a staging buffer's size in staging mode),
	 * so with O_DIRECT only a range's first and last chunk can need the bounce buffer. */
	uint64_t bound = (abs / chunk + 1) * chunk;
	if (bound < end)
		end = bound;
	s->off = abs;
	s->len = end - abs;
	s->tensor = g->tensor;
	s->tensor_off = g->tensor_off + r->next_pos;
	s->file = g->file;
	s->dst = g->dst ? g->dst + r->next_pos : NULL;
	s->slack = (end == g->off + g->len) ? g->slack : 0;
	s->buffer = UINT32_MAX;
	r->next_pos += s->len;
	return 1;
}

/* The buffered descriptor of a range's file. */
static int file_fd(const struct kiln__io *io, uint32_t file)
{
	return io->fds ? io->fds[file] : io->fd;
}

/* Choose how to read the slot's chunk: in place or through the bounce buffer, direct or not. */
static void plan(struct run *r, struct slot *s)
{
	s->done = 0;
	s->is_direct = r->dfds && r->direct_ok;
	if (s->is_direct) {
		uint64_t A = r->A;
		uint64_t roff = s->off / A * A;
		uint64_t rend = (s->off + s->len + A - 1) / A * A;
		int in_place = roff == s->off && (uintptr_t)s->dst % r->MA == 0 &&
			       rend - s->off <= s->len + s->slack;
		/* Bounce buffers are made on first need: aligned ranges never use one. */
		if (!in_place && !s->bounce)
			s->bounce = kiln__owned_alloc(r->bounce_size);
		if (in_place || s->bounce) {
			s->fd = r->dfds[s->file];
			s->roff = roff;
			s->rlen = rend - roff;
			s->rbuf = in_place ? s->dst : s->bounce;
			return;
		}
		s->is_direct = 0; /* no memory for a bounce buffer: this chunk is read buffered */
	}
	s->fd = file_fd(r->io, s->file);
	s->roff = s->off;
	s->rlen = s->len;
	s->rbuf = s->dst;
}

/* Bytes of the read that must land: up to the chunk's end (reading past EOF is fine only for
 * the alignment tail). */
static uint64_t needed(const struct slot *s)
{
	return s->off + s->len - s->roff;
}

static int stop_with(struct run *r, int code)
{
	if (!r->stop)
		r->stop = code;
	return code;
}

/* A chunk is complete: copy out of the bounce buffer, count it, tell the caller. */
static void land(struct run *r, struct slot *s)
{
	if (s->rbuf != s->dst)
		memcpy(s->dst, s->rbuf + (s->off - s->roff), s->len);
	r->io->res.bytes += s->len;
	r->io->res.chunks++;
	if (r->io->landed && !r->stop) {
		int rc = r->io->landed(r->io->landed_ctx, s->file, s->off, s->len, s->dst,
				       s->buffer, r->err);
		if (rc)
			stop_with(r, rc);
	}
	if (r->io->on_chunk && !r->stop) {
		kiln_chunk c = {.tensor = s->tensor,
				.buffer = s->buffer == UINT32_MAX ? 0 : s->buffer,
				.file = s->file,
				.offset = s->tensor_off,
				.length = s->len,
				.data = s->dst};
		if (r->io->on_chunk(r->io->ctx, &c) != 0) {
			kiln__fail(r->err, KILN_CANCELED, s->tensor, NULL, KILN_NO_OFFSET,
				   "the chunk callback stopped the stream at tensor %" PRIu64
				   " offset %" PRIu64,
				   s->tensor, s->tensor_off);
			stop_with(r, KILN_CANCELED);
		}
	}
	if (s->buffer != UINT32_MAX)
		r->buffer_busy[s->buffer] = 0;
	s->busy = 0;
}

/*
 * Digest one read result for a slot. Returns 1 when the slot must be (re)issued, 0 when it is
 * finished (landed or failed).
 */
static int complete(struct run *r, struct slot *s, ssize_t res)
{
	if (r->stop) {
		s->busy = 0;
		if (s->buffer != UINT32_MAX)
			r->buffer_busy[s->buffer] = 0;
		return 0;
	}
	if (res == -EINTR || res == -EAGAIN) {
		r->io->res.retries++;
		return 1;
	}
	if (res == -EINVAL && s->is_direct) {
		/* The file system refused this direct read: buffered from here on. Reads already in
		 * flight finish on the direct descriptor, which stays open until the end. */
		r->io->res.direct_fallback = EINVAL;
		r->io->res.direct = 0;
		r->direct_ok = 0;
		plan(r, s);
		r->io->res.retries++;
		return 1;
	}
	if (res < 0) {
		kiln__fail_sys(r->err, KILN_IO, (int)-res,
			       "read of %" PRIu64 " bytes at offset %" PRIu64 " failed: %s",
			       s->rlen - s->done, s->roff + s->done, strerror((int)-res));
		kiln__error_file(r->err, s->file); /* the offset is in that file */
		stop_with(r, KILN_IO);
		s->busy = 0;
		if (s->buffer != UINT32_MAX)
			r->buffer_busy[s->buffer] = 0;
		return 0;
	}
	s->done += (uint64_t)res;
	if (s->done >= needed(s)) {
		land(r, s);
		return 0;
	}
	if (res == 0) {
		kiln__file_ended(r->err, s->fd, s->roff + s->done, needed(s) - s->done);
		kiln__error_file(r->err, s->file);
		stop_with(r, KILN_IO);
		s->busy = 0;
		if (s->buffer != UINT32_MAX)
			r->buffer_busy[s->buffer] = 0;
		return 0;
	}
	/* Short read: ask for the rest. An unaligned remainder cannot be read directly. */
	r->io->res.retries++;
	if (s->is_direct && (s->roff + s->done) % r->A != 0) {
		s->fd = file_fd(r->io, s->file);
		s->is_direct = 0;
	}
	return 1;
}

/* Staging: take the next buffer in rotation, waiting for the caller to release it. */
static int take_buffer(struct run *r, struct slot *s)
{
	uint32_t b = r->next_buffer;
	if (r->buffer_busy[b])
		return 0; /* still in flight: wait for completions first */
	if (r->buffer_used[b] && r->io->reusing)
		r->io->reusing(r->io->landed_ctx, b);
	if (r->buffer_used[b] && r->io->before_reuse && r->io->before_reuse(r->io->ctx, b) != 0) {
		kiln__fail(r->err, KILN_CANCELED, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
			   "before_reuse stopped the stream at staging buffer %" PRIu32, b);
		stop_with(r, KILN_CANCELED);
		return 0;
	}
	r->buffer_used[b] = 1;
	r->buffer_busy[b] = 1;
	r->next_buffer = (b + 1) % r->io->nstaging;
	s->buffer = b;
	s->dst = r->io->staging[b];
	s->slack = r->io->staging_size - s->len; /* the rest of the buffer may take a tail read */
	return 1;
}

/* Fill a free slot with the next chunk; 0 when there is none (or the stream stopped). */
static int start(struct run *r, struct slot *s)
{
	if (r->stop)
		return 0;
	if (r->io->staging && r->buffer_busy[r->next_buffer])
		return 0;
	if (!next_chunk(r, s))
		return 0;
	if (r->io->staging && !take_buffer(r, s))
		return 0;
	s->busy = 1;
	plan(r, s);
	return 1;
}

static ssize_t do_pread(struct slot *s)
{
	ssize_t n = kiln__sys.pread(s->fd, s->rbuf + s->done, (size_t)(s->rlen - s->done),
				    (off_t)(s->roff + s->done));
	return n < 0 ? -errno : n;
}

static void run_pread(struct run *r)
{
	struct slot *s = &r->slots[0];
	while (start(r, s))
		while (complete(r, s, do_pread(s)))
			;
}

/*
 * Buffered pread into the caller's memory, neighbours together: the chunks of one file that lie
 * within one chunk-sized window of it, in order and at most GATHER_GAP bytes apart, are read
 * with one preadv (the bytes between them into a scratch buffer). A chunk never crosses a
 * tensor, so a file of small tensors was a system call a tensor: warm, kiln_load of 20,000
 * tensors ran at 0.84-0.90x two plain threads, gathered at 0.98-1.01x (docs/benchmarks.md,
 * "Neighbouring chunks in one call"). Callbacks still come a chunk at a time, in order, each once
 * its chunk is in place. A call that fails or comes back short counts one retry and leaves each
 * chunk to be read on its own from where its bytes stopped, so errors (named by their chunk),
 * EINTR and a file that ended read as they do a chunk at a time.
 */
#define GATHER_MAX 64u   /* chunks in one call */
#define GATHER_GAP 4096u /* bytes between two chunks read and thrown away */

/* The chunks of the next call into r->slots; how many (0: none left, or stopped). */
static uint32_t gather(struct run *r)
{
	uint32_t k = 0, most = r->nslots < GATHER_MAX ? r->nslots : GATHER_MAX;
	uint64_t window_end = 0;
	while (k < most && !r->stop) {
		size_t at_range = r->next_range;
		uint64_t at_pos = r->next_pos;
		struct slot *s = &r->slots[k];
		if (!next_chunk(r, s))
			break;
		if (k == 0) {
			window_end = (s->off / r->io->chunk + 1) * r->io->chunk;
		} else {
			const struct slot *p = &r->slots[k - 1];
			uint64_t end = p->off + p->len;
			if (s->file != p->file || s->off < end || s->off - end > GATHER_GAP ||
			    s->off + s->len > window_end) {
				r->next_range = at_range; /* it starts the next call */
				r->next_pos = at_pos;
				break;
			}
		}
		s->busy = 1;
		plan(r, s);
		k++;
	}
	return k;
}

static void run_preadv(struct run *r, uint8_t *gap)
{
	struct iovec iov[2 * GATHER_MAX];
	uint32_t k;
	while ((k = gather(r)) > 0) {
		int n = 0;
		uint64_t pos = r->slots[0].off;
		for (uint32_t i = 0; i < k; i++) {
			struct slot *s = &r->slots[i];
			if (s->off > pos)
				iov[n++] = (struct iovec){gap, (size_t)(s->off - pos)};
			iov[n++] = (struct iovec){s->dst, (size_t)s->len};
			pos = s->off + s->len;
		}
		ssize_t got = kiln__sys.preadv(r->slots[0].fd, iov, n, (off_t)r->slots[0].off);
		if (got < 0 || (uint64_t)got < pos - r->slots[0].off)
			r->io->res.retries++; /* the rest asked for again, a chunk at a time */
		for (uint32_t i = 0; i < k; i++) {
			struct slot *s = &r->slots[i];
			uint64_t into = s->off - r->slots[0].off, have = 0;
			if (got > 0 && (uint64_t)got > into)
				have =
				    (uint64_t)got - into < s->len ? (uint64_t)got - into : s->len;
			int again = 1;
			if (have == s->len || r->stop) /* landed; or released, once stopped */
				again = complete(r, s, (ssize_t)have);
			else
				s->done = have; /* counted above: the rest is read on its own */
			while (again)
				again = complete(r, s, do_pread(s));
		}
	}
}

static void run_memory(struct run *r)
{
	struct slot *s = &r->slots[0];
	while (start(r, s)) {
		const uint8_t *mem = r->io->mems ? r->io->mems[s->file] : r->io->mem;
		memcpy(s->rbuf, mem + s->roff, (size_t)s->rlen);
		complete(r, s, (ssize_t)s->rlen);
	}
}

/* Whether buffered reads are gathered: not into staging buffers (a chunk a buffer), not on
 * O_DIRECT descriptors (once open_direct has run: a file system that refuses them reads
 * buffered), and not when each chunk's bytes are hashed as they land (the landed hook): there a
 * call a chunk keeps the hash right behind its copy, where a window read first and hashed after
 * measured 3-6 % slower checked loads (docs/benchmarks.md). */
static int gathers(const struct run *r)
{
	return !r->io->staging && !r->dfds && !r->io->landed;
}

/* Buffered reads: gathered into the caller's memory, else a chunk at a time. */
static void run_buffered(struct run *r)
{
	if (!gathers(r)) {
		run_pread(r);
		return;
	}
	uint8_t gap[GATHER_GAP];
	run_preadv(r, gap);
}

/* Through the source: fill every slot with a chunk, read each file's run of them in one call,
 * land them in order; again until the chunks are done. */
#define READER_BATCH 1024u

static void run_reader(struct run *r, struct kiln__span *spans)
{
	for (;;) {
		uint32_t k = 0;
		while (k < r->nslots && start(r, &r->slots[k]))
			k++;
		if (!k)
			return;
		for (uint32_t i = 0; i < k; i++)
			spans[i] = (struct kiln__span){.off = r->slots[i].roff,
						       .len = r->slots[i].rlen,
						       .dst = r->slots[i].rbuf};
		int rc = 0;
		for (uint32_t a = 0, b; a < k && !rc; a = b) {
			for (b = a + 1; b < k && r->slots[b].file == r->slots[a].file; b++)
				;
			rc = r->io->read_spans(r->io->read_ctx, r->slots[a].file, spans + a, b - a,
					       r->io->stop, r->err);
			if (rc) {
				kiln__error_file(r->err, r->slots[a].file);
				stop_with(r, rc);
			}
		}
		for (uint32_t i = 0; i < k; i++)
			complete(r, &r->slots[i], rc ? 0 : (ssize_t)r->slots[i].rlen);
	}
}

static void queue(struct io_uring *ring, struct slot *s)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	/* The ring has qd entries and at most qd slots are busy, so an SQE is always free. */
	io_uring_prep_read(sqe, s->fd, s->rbuf + s->done, (unsigned)(s->rlen - s->done),
			   s->roff + s->done);
	io_uring_sqe_set_data(sqe, s);
}

/* Take every completion the ring holds; each finished or failed read frees its slot, a retried
 * one is queued again (submitted with the next batch). */
static void reap(struct run *r, struct io_uring *ring, uint32_t *inflight)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	io_uring_for_each_cqe(ring, head, cqe)
	{
		struct slot *s = io_uring_cqe_get_data(cqe);
		if (cqe->res > 0)
			MARK_DEFINED(s->rbuf + s->done, (size_t)cqe->res);
		int res = kiln__sys.uring_result(cqe->res, s->fd, s->roff + s->done,
						 (size_t)(s->rlen - s->done));
		seen++;
		(*inflight)--;
		if (complete(r, s, res)) {
			queue(ring, s);
			(*inflight)++;
		}
	}
	io_uring_cq_advance(ring, seen);
}

/* Returns 0, or -errno when io_uring cannot be set up (the caller falls back to pread).
 * One system call per round submits every queued read and waits for the first completion;
 * every completion ready by then is taken before the next round. Small reads from the page
 * cache complete during the submit itself, so a round of qd of them costs one call, not qd. */
static int run_uring(struct run *r)
{
	struct io_uring ring;
	int rc = kiln__sys.uring_init(r->nslots, &ring);
	if (rc < 0)
		return rc;
	uint32_t inflight = 0; /* queued or in the kernel */
	for (;;) {
		for (uint32_t i = 0; i < r->nslots && !r->stop; i++) {
			struct slot *s = &r->slots[i];
			if (s->busy || !start(r, s))
				continue;
			queue(&ring, s);
			inflight++;
		}
		if (inflight == 0)
			break;
		int sub = io_uring_submit_and_wait(&ring, 1);
		if (sub < 0 && sub != -EINTR && sub != -EAGAIN && sub != -EBUSY) {
			kiln__fail_sys(r->err, KILN_IO, -sub, "io_uring_submit failed: %s",
				       strerror(-sub));
			stop_with(r, KILN_IO);
			/* What never reached the kernel is dropped with the ring; what did is
			 * waited for, so no read lands after return. */
			inflight -= io_uring_sq_ready(&ring);
			while (inflight) {
				struct io_uring_cqe *cqe;
				int w = io_uring_wait_cqe(&ring, &cqe);
				if (w < 0 && w != -EINTR)
					break;
				reap(r, &ring, &inflight);
			}
			break;
		}
		reap(r, &ring, &inflight);
	}
	io_uring_queue_exit(&ring);
	return 0;
}

/* O_DIRECT alignment: statx(STATX_DIOALIGN), else the device's logical block size, else a page.
 * Returns 0, or an errno when the file does not support direct I/O. */
static int dio_alignment(int fd, uint32_t *off_align, uint32_t *mem_align)
{
	struct statx stx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN)) {
		if (stx.stx_dio_offset_align == 0)
			return EINVAL; /* the file system says: no direct I/O for this file */
		*off_align = stx.stx_dio_offset_align;
		*mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 512;
		return 0;
	}
	struct stat st;
	uint32_t bs = 0;
	if (fstat(fd, &st) == 0) {
		char path[96];
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/logical_block_size",
			 major(st.st_dev), minor(st.st_dev));
		FILE *f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%u", &bs) != 1)
				bs = 0;
			fclose(f);
		}
	}
	*off_align = bs && (bs & (bs - 1)) == 0 && bs <= 65536 ? bs : (uint32_t)kiln__page_size();
	*mem_align = *off_align;
	return 0;
}

static void close_direct(struct run *r)
{
	for (uint32_t i = 0; r->dfds && i < r->nfiles; i++)
		if (r->dfds[i] >= 0)
			close(r->dfds[i]);
	free(r->dfds);
	r->dfds = NULL;
}

/* An O_DIRECT descriptor for every file, aligned for the strictest of them; any refusal means
 * buffered reads for all (said in direct_fallback). */
static void open_direct(struct run *r)
{
	struct kiln__io *io = r->io;
	r->nfiles = io->fds ? io->nfds : 1;
	r->dfds = malloc(r->nfiles * sizeof(*r->dfds));
	if (!r->dfds) {
		io->res.direct_fallback = ENOMEM;
		return;
	}
	for (uint32_t i = 0; i < r->nfiles; i++)
		r->dfds[i] = -1;
	uint32_t A = 0, MA = 0;
	for (uint32_t i = 0; i < r->nfiles; i++) {
		int fd = file_fd(io, i);
		uint32_t a = 0, ma = 0;
		int e = dio_alignment(fd, &a, &ma);
		/* Reopen the same open file, not the path: the path may name a newer file. */
		char path[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		if (!e && (r->dfds[i] = kiln__sys.open(path, O_RDONLY | O_DIRECT | O_CLOEXEC)) < 0)
			e = errno;
		if (e) {
			io->res.direct_fallback = e;
			close_direct(r);
			return;
		}
		A = a > A ? a : A;
		MA = ma > MA ? ma : MA;
	}
	r->direct_ok = 1;
	r->A = A;
	r->MA = MA;
	io->dio_align = A;
	io->res.direct = 1;
	/* Chunks must start on aligned boundaries to be read in place. */
	if (io->chunk % A)
		io->chunk = (io->chunk / A + 1) * A;
}

/*
 * The engine AUTO picks. Where the page cache already holds every byte asked for, one pread at a
 * time is a plain copy and io_uring only adds its bookkeeping (measured on an H200 host: warm
 * 1 GiB streams at 7.6 GB/s with pread against 6.4 with io_uring; cold both ran at the disk's
 * 2.0 GB/s); where the disk has to be read, keeping requests in flight is what pays. Residency
 * comes from cachestat(2) (Linux 6.5): one call over the whole span when the ranges are of one
 * file (enough for a warm file), else one per range, sampled up to CACHED_SAMPLE ranges; without
 * it the answer is io_uring, as before there was a choice.
 */
#define CACHED_SAMPLE 64
#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif
struct cachestat_range_ {
	uint64_t off, len;
};
struct cachestat_ {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int kiln__span_cached(int fd, uint64_t off, uint64_t len)
{
	/* Kernels before 6.5 (or a sandbox) refuse it: ask once, not on every open. */
	static int missing;
	if (len == 0 || __atomic_load_n(&missing, __ATOMIC_RELAXED))
		return 0;
	uint64_t page = kiln__page_size();
	uint64_t first = off / page, last = (off + len - 1) / page;
	struct cachestat_range_ cr = {first * page, (last - first + 1) * page};
	struct cachestat_ cs;
	if (syscall(__NR_cachestat, fd, &cr, &cs, 0) != 0) {
		if (errno == ENOSYS || errno == EPERM)
			__atomic_store_n(&missing, 1, __ATOMIC_RELAXED);
		return 0;
	}
	return cs.nr_cache >= last - first + 1;
}

static int all_cached(const struct kiln__io *io, const struct kiln__range *ranges, size_t n)
{
	uint64_t lo = UINT64_MAX, hi = 0;
	int one_file = 1;
	for (size_t i = 0; i < n; i++) {
		const struct kiln__range *g = &ranges[i];
		one_file &= !io->fds || g->file == ranges[0].file;
		if (g->len && g->off < lo)
			lo = g->off;
		if (g->len && g->off + g->len > hi)
			hi = g->off + g->len;
	}
	if (hi == 0)
		return 1;
	if (one_file && kiln__span_cached(io->fds ? io->fds[ranges[0].file] : io->fd, lo, hi - lo))
		return 1;
	/* Runs of a slice may be cached while the gaps between them are not. */
	size_t step = n > CACHED_SAMPLE ? n / CACHED_SAMPLE : 1;
	for (size_t i = 0; i < n; i += step) {
		const struct kiln__range *g = &ranges[i];
		if (g->len == 0)
			continue;
		if (!kiln__span_cached(io->fds ? io->fds[g->file] : io->fd, g->off, g->len))
			return 0;
	}
	return 1;
}

int kiln__io_run(struct kiln__io *io, const struct kiln__range *ranges, size_t n, kiln_error *err)
{
	memset(&io->res, 0, sizeof(io->res));
	struct run r = {.io = io, .ranges = ranges, .n = n, .err = err};
	int rc = 0;
	int in_memory = io->mem || io->mems || io->read_spans;
	if (io->direct && !in_memory)
		open_direct(&r);
	int engine = in_memory ? KILN_ENGINE_PREAD : io->engine;
	if (engine == KILN_ENGINE_AUTO && !io->direct && all_cached(io, ranges, n))
		engine = KILN_ENGINE_PREAD;
	/* Through a source, one batch is one round of its requests: as many chunks as go together
	 * (they land in their destinations; nothing is held per slot). */
	r.nslots = io->read_spans                ? (io->qd > READER_BATCH ? io->qd : READER_BATCH)
		   : engine != KILN_ENGINE_PREAD ? io->qd
		   : gathers(&r)                 ? GATHER_MAX
						 : 1;
	if (io->staging && r.nslots > io->nstaging)
		r.nslots = io->nstaging;
	/* A buffer whose bytes the landed hook still works on is not read into (reusing waits):
	 * one buffer more than the reads in flight lets that work run while the others read. */
	if (io->staging && io->reusing && io->nstaging > 1 && r.nslots == io->nstaging)
		r.nslots = io->nstaging - 1;
	r.slots = calloc(r.nslots, sizeof(*r.slots));
	if (io->staging) {
		r.buffer_used = calloc(io->nstaging, 1);
		r.buffer_busy = calloc(io->nstaging, 1);
	}
	struct kiln__span *spans = io->read_spans ? calloc(r.nslots, sizeof(*spans)) : NULL;
	int nomem = !r.slots || (io->staging && (!r.buffer_used || !r.buffer_busy)) ||
		    (io->read_spans && !spans);
	/* A bounce buffer holds one chunk: no more than the longest range needs (many small
	 * ranges, as a slice has, would otherwise each get a whole chunk's worth). */
	uint64_t chunk = io->staging ? io->staging_size : io->chunk, longest = 0;
	for (size_t i = 0; i < n && longest < chunk; i++)
		longest = ranges[i].len > longest ? ranges[i].len : longest;
	r.bounce_size = (size_t)(longest < chunk ? longest : chunk) + 2u * r.A;
	if (nomem) {
		rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate %u read slots",
				    r.nslots);
		goto out;
	}

	if (io->read_spans) {
		run_reader(&r, spans);
	} else if (in_memory) {
		run_memory(&r);
	} else if (engine == KILN_ENGINE_PREAD) {
		run_buffered(&r);
	} else {
		int e = run_uring(&r);
		if (e < 0) {
			io->res.uring_fallback = -e;
			engine = KILN_ENGINE_PREAD;
			run_buffered(&r);
		}
	}
	io->res.engine = engine == KILN_ENGINE_PREAD ? KILN_ENGINE_PREAD : KILN_ENGINE_URING;
	rc = r.stop;
out:
	for (uint32_t i = 0; r.slots && i < r.nslots; i++)
		if (r.slots[i].bounce)
			kiln__owned_free(r.slots[i].bounce, r.bounce_size);
	free(r.slots);
	free(spans);
	free(r.buffer_used);
	free(r.buffer_busy);
	close_direct(&r);
	return rc;
}
