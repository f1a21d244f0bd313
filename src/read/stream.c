/* SPDX-License-Identifier: MIT */
/*
 * Streaming reads through the chunk engine (src/io/engine.c): kiln_stream (chosen tensors into
 * caller memory or a ring of staging buffers), kiln_tensor_read (one tensor, the common case) and
 * kiln_model_read_all (every byte of every file, kept nowhere).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "read/read.h"

/* The start every streaming call shares: clear *err and *result, copy the caller's options into
 * *o (all zero for NULL), and check them (size, flags, engine, limits, reserved words). */
static int begin_options(const kiln_stream_options *opts, kiln_stream_options *o,
			 kiln_stream_result *result, kiln_error *err)
{
	kiln__clear_error(err);
	if (result)
		memset(result, 0, sizeof(*result));
	memset(o, 0, sizeof(*o));
	if (opts) {
		int rc = kiln__check_size("kiln_stream_options", opts->size, sizeof(*o), err);
		if (rc)
			return rc;
		*o = *opts;
	}
	if (o->flags & ~(uint32_t)KILN_STREAM_DIRECT || o->engine > KILN_ENGINE_PREAD)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags",
					"unknown stream flags 0x%x or engine %u", o->flags,
					o->engine);
	if (o->chunk_size > KILN__REQUEST_MAX || o->staging_size > KILN__REQUEST_MAX ||
	    o->queue_depth > KILN__QD_MAX)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "chunk_size",
		    "chunk and staging sizes are at most 1 GiB, queue_depth 4096");
	for (size_t i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
						"reserved stream options must be 0");
	return 0;
}

static int begin(const kiln_model *m, const kiln_stream_options *opts, kiln_stream_options *o,
		 kiln_stream_result *result, kiln_error *err)
{
	int rc = begin_options(opts, o, result, err);
	if (!rc && !m)
		rc = kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model is NULL");
	return rc;
}

/* The files a stream reads, as the engine takes them: one file's descriptor or memory, or an array
 * of each for several, from each file's feed (src/source/file.h: its bytes in memory where they
 * are, else its descriptor, a random-access one of the feed's own for scattered runs). */
struct files {
	/* Set when a file has neither a descriptor nor its bytes in memory (a URL opened with
	 * KILN_OPEN_DIRECTORY_ONLY): every file is then read through its source. */
	const kiln_model *reader;
	int one_fd;
	const uint8_t *one_mem;
	int *fds;
	const uint8_t **mems;
	struct kiln__feed *feeds, one;
	uint32_t n;
};

/* The feeds of m's files, `how` (KILN__FEED_*) for those `used` marks (NULL: all), plain for the
 * rest. */
static int files_get(const kiln_model *m, unsigned how, const uint8_t *used, struct files *fs,
		     kiln_error *err)
{
	memset(fs, 0, sizeof(*fs));
	fs->n = m->nfiles;
	struct kiln__feed *feeds = &fs->one;
	if (m->nfiles > 1) {
		fs->feeds = feeds = calloc(m->nfiles, sizeof(*feeds));
		fs->fds = calloc(m->nfiles, sizeof(*fs->fds));
		fs->mems = calloc(m->nfiles, sizeof(*fs->mems));
		if (!fs->feeds || !fs->fds || !fs->mems) {
			free(fs->feeds);
			free(fs->fds);
			free(fs->mems);
			return kiln__nomem(err, 0, NULL);
		}
	}
	int in_memory = 1;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		kiln__file_feed(&m->files[i], !used || used[i] ? how : 0, &feeds[i]);
		if (feeds[i].fd < 0 && !feeds[i].mem)
			fs->reader = m;
		in_memory &= feeds[i].mem != NULL;
		if (fs->fds) {
			fs->fds[i] = feeds[i].fd;
			fs->mems[i] = feeds[i].mem;
		}
	}
	if (!fs->fds) {
		fs->one_fd = fs->one.fd;
		fs->one_mem = fs->one.mem;
	} else if (!in_memory) {
		free(fs->mems);
		fs->mems = NULL;
	}
	return 0;
}

static void files_put(struct files *fs)
{
	struct kiln__feed *feeds = fs->feeds ? fs->feeds : &fs->one;
	for (uint32_t i = 0; i < fs->n; i++)
		kiln__feed_done(&feeds[i]);
	free(fs->feeds);
	free(fs->fds);
	free(fs->mems);
}

static int read_through_source(void *ctx, uint32_t file, const struct kiln__span *spans, size_t n,
			       const _Atomic int *stop, kiln_error *err)
{
	return kiln__file_read_spans(&((const kiln_model *)ctx)->files[file], spans, n, stop, err);
}

/* Add one engine run's counts to a call's result. */
static void add_result(kiln_stream_result *sum, const kiln_stream_result *one)
{
	sum->bytes += one->bytes;
	sum->chunks += one->chunks;
	sum->retries += one->retries;
	sum->engine = one->engine;
	sum->direct = one->direct;
	if (one->uring_fallback)
		sum->uring_fallback = one->uring_fallback;
	if (one->direct_fallback)
		sum->direct_fallback = one->direct_fallback;
}

static int run(const kiln_model *m, const struct files *fs, const kiln_stream_options *o,
	       const struct kiln__range *ranges, size_t n, const _Atomic int *stop, int spare_core,
	       kiln_stream_result *result, kiln_error *err);

/* A checked read of more than `window` bytes: runs of at most that many each, a range cut where
 * a run ends (the chunk there is hashed by both runs). */
static int run_windows(const kiln_model *m, const struct files *fs, const kiln_stream_options *o,
		       const struct kiln__range *ranges, size_t n, const _Atomic int *stop,
		       int spare_core, uint64_t window, kiln_stream_result *result, kiln_error *err)
{
	struct kiln__range *batch = malloc((n + 1) * sizeof(*batch));
	if (!batch)
		return kiln__nomem(err, (n + 1) * sizeof(*batch), "a checked read");
	kiln_stream_result sum = {0}, one;
	int rc = 0;
	size_t k = 0;
	uint64_t bytes = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		const struct kiln__range *r = &ranges[i];
		uint64_t at = 0;
		do {
			uint64_t take = r->len - at < window - bytes ? r->len - at : window - bytes;
			struct kiln__range *b = &batch[k++];
			*b = *r;
			b->off += at;
			b->len = take;
			b->dst = r->dst ? r->dst + at : NULL;
			b->tensor_off += at;
			b->slack = at + take == r->len ? r->slack : 0;
			bytes += take;
			at += take;
			if (bytes == window) {
				rc = run(m, fs, o, batch, k, stop, spare_core, &one, err);
				add_result(&sum, &one);
				k = 0;
				bytes = 0;
			}
		} while (!rc && at < r->len);
	}
	if (!rc && k) {
		rc = run(m, fs, o, batch, k, stop, spare_core, &one, err);
		add_result(&sum, &one);
	}
	free(batch);
	if (result)
		*result = sum;
	return rc;
}

/* Run the engine over `ranges` of m's files (one queue for all of them), staging through
 * o->staging when it is set; the parts it lands checked against their digests where the files
 * keep them for that (src/read/parts.c). */
static int run(const kiln_model *m, const struct files *fs, const kiln_stream_options *o,
	       const struct kiln__range *ranges, size_t n, const _Atomic int *stop, int spare_core,
	       kiln_stream_result *result, kiln_error *err)
{
	if (result)
		memset(result, 0, sizeof(*result));
	uint64_t window = kiln__parts_window(m), total = 0;
	for (size_t i = 0; window && i < n; i++)
		total += ranges[i].len;
	if (window && total > window)
		return run_windows(m, fs, o, ranges, n, stop, spare_core, window, result, err);
	struct kiln__parts *parts = NULL;
	int overlap = 0;
	int rc = kiln__parts_open(m, ranges, n, o->staging ? o->staging_count : 0, spare_core, stop,
				  &parts, &overlap, err);
	if (rc)
		return rc;
	if (overlap) {
		/* Ranges that share bytes (a tensor asked for twice): each checked in a run of its
		 * own. */
		kiln_stream_result sum = {0}, one;
		for (size_t i = 0; i < n && !rc; i++) {
			rc = run(m, fs, o, &ranges[i], 1, stop, spare_core, &one, err);
			add_result(&sum, &one);
		}
		if (result)
			*result = sum;
		return rc;
	}
	struct kiln__io io = {
	    .fd = fs->one_fd,
	    .fds = fs->fds,
	    .nfds = fs->fds ? fs->n : 0,
	    .mems = fs->mems,
	    .direct = (o->flags & KILN_STREAM_DIRECT) != 0,
	    .chunk = o->chunk_size ? o->chunk_size : KILN__CHUNK_DEFAULT,
	    .qd = o->queue_depth ? o->queue_depth : KILN__QD_DEFAULT,
	    .engine = (int)o->engine,
	    .mem = fs->one_mem,
	    .read_spans = fs->reader ? read_through_source : NULL,
	    .read_ctx = (void *)fs->reader,
	    .stop = stop,
	    .staging = o->staging,
	    .nstaging = o->staging_count,
	    .staging_size = o->staging_size,
	    .on_chunk = o->on_chunk,
	    .landed = parts ? kiln__parts_landed : NULL,
	    .reusing = parts && kiln__parts_threaded(parts) ? kiln__parts_reusing : NULL,
	    .landed_ctx = parts,
	    .before_reuse = o->before_reuse,
	    .ctx = o->ctx,
	};
	rc = kiln__io_run(&io, ranges, n, err);
	if (!rc && parts)
		rc = kiln__parts_finish(parts, err);
	kiln__parts_free(parts);
	if (result)
		*result = io.res;
	return rc;
}

/* A failure reading a file: say which in the message too (as kiln__file_read does). */
static void name_file(const kiln_model *m, int rc, kiln_error *err)
{
	if (rc && err && err->file < m->nfiles && m->files[err->file].path && rc != KILN_CANCELED &&
	    rc != KILN_INVAL)
		kiln__error_named(err, kiln__file_shown(&m->files[err->file]));
}

/* run() over every file of the model as it is. */
static int run_model(const kiln_model *m, const kiln_stream_options *o,
		     const struct kiln__range *ranges, size_t n, const _Atomic int *stop,
		     int spare_core, kiln_stream_result *result, kiln_error *err)
{
	struct files fs;
	int rc = files_get(m, 0, NULL, &fs, err);
	if (!rc)
		rc = run(m, &fs, o, ranges, n, stop, spare_core, result, err);
	files_put(&fs);
	name_file(m, rc, err);
	return rc;
}

int kiln__stream_ranges(const kiln_model *m, const kiln_stream_options *o,
			const struct kiln__range *ranges, size_t n, const _Atomic int *stop,
			int spare_core, kiln_stream_result *result, kiln_error *err)
{
	return run_model(m, o, ranges, n, stop, spare_core, result, err);
}

/* The two modes of a stream: destinations given (the staging fields do not apply), or else a
 * ring of staging buffers with the callback that consumes them. */
static int stream_mode(kiln_stream_options *o, void *const *dests, kiln_error *err)
{
	if (dests) {
		o->staging = NULL;
		return 0;
	}
	if (!o->staging || o->staging_count == 0 || o->staging_size == 0 || !o->on_chunk)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "staging",
		    "without destinations, staging buffers (count, size) and on_chunk "
		    "are required");
	return 0;
}

/* The engine's range for tensor t, landing at dst. */
static struct kiln__range range_of(const kiln_tensor *t, void *dst)
{
	return (struct kiln__range){.off = t->file_offset,
				    .len = t->byte_length,
				    .dst = dst,
				    .tensor = t->index,
				    .file = t->file};
}

int kiln_stream(const kiln_model *m, const uint64_t *tensors, size_t count, void *const *dests,
		const kiln_stream_options *opts, kiln_stream_result *result, kiln_error *err)
{
	kiln_stream_options o;
	int rc = begin(m, opts, &o, result, err);
	if (rc)
		return rc;
	rc = stream_mode(&o, dests, err);
	if (rc)
		return rc;
	int staging = dests == NULL;
	if (!tensors)
		count = (size_t)m->count;

	struct kiln__range *ranges = calloc(count ? count : 1, sizeof(*ranges));
	if (!ranges)
		return kiln__nomem(err, 0, NULL);
	for (size_t k = 0; k < count; k++) {
		uint64_t i = tensors ? tensors[k] : k;
		const kiln_tensor *t = kiln_model_tensor(m, i);
		if (!t || (!staging && !dests[k] && t->byte_length)) {
			free(ranges);
			if (!t)
				return kiln__fail_inval(
				    err, i, NULL, "tensor index %" PRIu64 " is out of range", i);
			return kiln__fail_inval(err, i, NULL, "destination %zu is NULL", k);
		}
		ranges[k] = range_of(t, staging ? NULL : dests[k]);
	}
	rc = run_model(m, &o, ranges, count, NULL, 1, result, err);
	free(ranges);
	return rc;
}

int kiln_tensor_read(const kiln_model *m, uint64_t index, void *dst, size_t cap,
		     kiln_chunk_fn on_chunk, void *ctx, kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_fits_or_fail(m, index, dst, cap, err);
	if (!t)
		return KILN_INVAL;
	kiln_stream_options o = {.size = sizeof(o), .on_chunk = on_chunk, .ctx = ctx};
	struct kiln__range r = range_of(t, dst);
	return run_model(m, &o, &r, 1, NULL, 1, NULL, err);
}

/* One tensor's share of a slice read: its runs and where they land. */
struct slice_job {
	const kiln_tensor *t;
	struct kiln__runs r;
	uint8_t *dst;
};

static uint64_t jobs_bytes(const struct slice_job *jobs, size_t count)
{
	uint64_t bytes = 0;
	for (size_t j = 0; j < count; j++)
		bytes += jobs[j].r.bytes;
	return bytes;
}

/* The runs of every job, in order, through one queue of reads: the engine gets them in batches
 * of KILN__RUN_BATCH ranges, each batch's reads in flight together, so memory stays small whatever
 * the number of runs, and one tensor's runs overlap the next one's. */
static int read_jobs(const kiln_model *m, const struct slice_job *jobs, size_t count,
		     const kiln_stream_options *o, kiln_stream_result *result, kiln_error *err)
{
	uint64_t total = 0;
	int partial = 0;
	for (size_t j = 0; j < count; j++) {
		total += jobs[j].r.bytes ? jobs[j].r.runs : 0;
		/* rows of a slice, with gaps between them; one range reads ahead as it should */
		partial |=
		    jobs[j].r.runs > 1 && jobs[j].r.runs * jobs[j].r.len < jobs[j].t->byte_length;
	}
	if (!total)
		return 0;
	/* The kernel's read-ahead would read on past every run of a cold file (a quarter of each
	 * row becomes most of the file): the files read for scattered runs get descriptors of their
	 * own with random-access advice (KILN__FEED_RANDOM), which read just the runs and leave
	 * the model's descriptors and their read-ahead state alone for other threads. */
	uint8_t *used = partial ? calloc(m->nfiles, 1) : NULL;
	for (size_t j = 0; used && j < count; j++)
		used[jobs[j].t->file] = 1;
	struct files fs;
	int rc = partial && !used ? kiln__nomem(err, 0, NULL)
				  : files_get(m, partial ? KILN__FEED_RANDOM : 0, used, &fs, err);
	free(used);
	if (rc)
		return rc;
	/* Small runs keep more reads in flight than the default queue of whole chunks (a cold
	 * disk serves many small requests best all at once: 8 KiB runs read 25-30 % faster at
	 * 256 in flight than at 32 here); each request costs only its slot. */
	kiln_stream_options deep = *o;
	if (!deep.queue_depth && jobs_bytes(jobs, count) / total < KILN__CHUNK_DEFAULT / 8)
		deep.queue_depth = KILN__QD_SMALL_RUNS;
	o = &deep;
	size_t cap = total < KILN__RUN_BATCH ? (size_t)total : KILN__RUN_BATCH, n = 0;
	struct kiln__range *ranges = calloc(cap, sizeof(*ranges));
	rc = ranges ? 0 : kiln__nomem(err, 0, NULL);
	kiln_stream_result one = {0};
	for (size_t j = 0; j < count && !rc; j++) {
		const struct slice_job *b = &jobs[j];
		for (uint64_t k = 0; b->r.bytes && k < b->r.runs && !rc; k++) {
			ranges[n++] = (struct kiln__range){.off = b->t->file_offset + b->r.first +
								  k * b->r.stride,
							   .len = b->r.len,
							   .dst = b->dst + k * b->r.len,
							   .tensor = b->t->index,
							   .tensor_off = k * b->r.len,
							   .file = b->t->file};
			if (n == cap) { /* a full batch goes now; the last, shorter one below */
				rc = run(m, &fs, o, ranges, n, NULL, 1, &one, err);
				if (result)
					add_result(result, &one);
				n = 0;
			}
		}
	}
	if (!rc && n) {
		rc = run(m, &fs, o, ranges, n, NULL, 1, &one, err);
		if (result)
			add_result(result, &one);
	}
	free(ranges);
	files_put(&fs);
	return rc;
}

static int read_runs(const kiln_model *m, const kiln_tensor *t, const struct kiln__runs *r,
		     uint8_t *dst, kiln_chunk_fn on_chunk, void *ctx, kiln_error *err)
{
	kiln_stream_options o = {.size = sizeof(o), .on_chunk = on_chunk, .ctx = ctx};
	struct slice_job job = {.t = t, .r = *r, .dst = dst};
	return read_jobs(m, &job, 1, &o, NULL, err);
}

static int fits(const kiln_tensor *t, uint64_t bytes, const void *dst, size_t cap, kiln_error *err)
{
	if (cap < bytes || (!dst && bytes))
		return kiln__fail_inval(err, t->index, NULL,
					"tensor %" PRIu64 ": %" PRIu64
					" bytes to read; the buffer holds %zu",
					t->index, bytes, dst ? cap : 0);
	return 0;
}

int kiln_tensor_read_slice(const kiln_model *m, uint64_t index, const kiln_slice *s, void *dst,
			   size_t cap, kiln_chunk_fn on_chunk, void *ctx, kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (!t)
		return KILN_INVAL;
	struct kiln__runs r;
	int rc = kiln__slice_runs(t, s, &r, err);
	if (!rc)
		rc = fits(t, r.bytes, dst, cap, err);
	return rc ? rc : read_runs(m, t, &r, dst, on_chunk, ctx, err);
}

int kiln_tensor_read_range(const kiln_model *m, uint64_t index, uint64_t offset, uint64_t length,
			   void *dst, size_t cap, kiln_chunk_fn on_chunk, void *ctx,
			   kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (!t)
		return KILN_INVAL;
	uint64_t end;
	if (kiln__add_overflows(offset, length, &end) || end > t->byte_length)
		return kiln__fail_inval(err, index, "range",
					"tensor %" PRIu64 ": bytes [%" PRIu64 ", +%" PRIu64
					") pass its %" PRIu64 "-byte payload",
					index, offset, length, t->byte_length);
	int rc = fits(t, length, dst, cap, err);
	struct kiln__runs r = {.runs = 1, .first = offset, .len = length, .bytes = length};
	return rc ? rc : read_runs(m, t, &r, dst, on_chunk, ctx, err);
}

int kiln_read_slices(const kiln_model *m, const uint64_t *tensors, const kiln_slice *slices,
		     size_t count, void *const *dests, const kiln_stream_options *opts,
		     kiln_stream_result *result, kiln_error *err)
{
	kiln_stream_options o;
	int rc = begin(m, opts, &o, result, err);
	if (rc)
		return rc;
	if (count && (!tensors || !slices || !dests))
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"tensors, slices and dests are required");
	if (o.staging)
		return kiln__fail_inval(err, KILN_NO_INDEX, "staging",
					"slices land in dests; staging buffers do not apply");
	struct slice_job *jobs = calloc(count ? count : 1, sizeof(*jobs));
	if (!jobs)
		return kiln__nomem(err, 0, NULL);
	/* Every slice is checked before the first read. */
	for (size_t k = 0; k < count && !rc; k++) {
		struct slice_job *b = &jobs[k];
		if (!(b->t = kiln__tensor_or_fail(m, tensors[k], err)))
			rc = KILN_INVAL;
		else if (!(rc = kiln__slice_runs(b->t, &slices[k], &b->r, err)) && b->r.bytes &&
			 !dests[k])
			rc = kiln__fail_inval(err, tensors[k], NULL, "destination %zu is NULL", k);
		b->dst = dests[k];
	}
	if (!rc)
		rc = read_jobs(m, jobs, count, &o, result, err);
	free(jobs);
	return rc;
}

int kiln_tensor_slice_data(const kiln_model *m, uint64_t index, const kiln_slice *s,
			   const void **data, uint64_t *bytes, kiln_error *err)
{
	kiln__clear_error(err);
	if (!data || !bytes)
		return kiln__fail_inval(err, index, NULL, "data or bytes is NULL");
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (!t)
		return KILN_INVAL;
	struct kiln__runs r;
	int rc = kiln__slice_runs(t, s, &r, err);
	if (rc)
		return rc;
	if (r.runs > 1)
		return kiln__fail(err, KILN_UNSUPPORTED, index, "slice", KILN_NO_OFFSET,
				  "tensor %" PRIu64 ": a slice of axis %" PRIu32 " is %" PRIu64
				  " runs, not one; read it with kiln_tensor_read_slice()",
				  index, s->axis, r.runs);
	*data = t->data ? (const uint8_t *)t->data + r.first : NULL;
	*bytes = r.bytes;
	return 0;
}

int kiln_model_read_all(const kiln_model *m, const kiln_stream_options *opts,
			kiln_stream_result *result, kiln_error *err)
{
	kiln_stream_options o;
	int rc = begin(m, opts, &o, result, err);
	if (rc)
		return rc;
	if (o.staging && (o.staging_count == 0 || o.staging_size == 0))
		return kiln__fail_inval(err, KILN_NO_INDEX, "staging",
					"staging buffers need a count and a size");
	void **own = NULL;
	void *mem = NULL;
	size_t mem_len = 0;
	if (!o.staging) {
		uint32_t nb = o.queue_depth ? o.queue_depth : KILN__READ_ALL_BUFFERS;
		size_t size = o.chunk_size ? o.chunk_size : KILN__CHUNK_DEFAULT;
		mem_len = (size_t)nb * size; /* at most 4096 x 1 GiB: fits a 64-bit size_t */
		own = calloc(nb, sizeof(*own));
		mem = own ? kiln__owned_alloc(mem_len) : NULL;
		if (!mem) {
			free(own);
			return kiln__fail_sys(
			    err, KILN_NOMEM, ENOMEM,
			    "cannot allocate %" PRIu32 " read buffers of %zu bytes", nb, size);
		}
		for (uint32_t i = 0; i < nb; i++)
			own[i] = (uint8_t *)mem + (size_t)i * size;
		o.staging = own;
		o.staging_count = nb;
		o.staging_size = size;
		o.before_reuse =
		    NULL; /* the buffers are kiln's: nothing of the caller's to wait for */
	}
	/* One range per file over the whole of it: headers, directories, pads, payloads and the
	 * gaps between them. Chunks report their file and offset in it. This reads the files
	 * whatever the source (finding unreadable sectors is its point: KILN__FEED_FILE); only a
	 * buffer, which has no file behind it, is copied from memory. */
	struct files fs;
	struct kiln__range *ranges = calloc(m->nfiles ? m->nfiles : 1, sizeof(*ranges));
	rc = ranges ? files_get(m, KILN__FEED_FILE, NULL, &fs, err) : kiln__nomem(err, 0, NULL);
	if (!rc) {
		for (uint32_t i = 0; i < m->nfiles; i++)
			ranges[i] = (struct kiln__range){
			    .off = 0, .len = m->files[i].size, .tensor = KILN_NO_INDEX, .file = i};
		rc = run(m, &fs, &o, ranges, m->nfiles, NULL, 1, result, err);
		files_put(&fs);
		name_file(m, rc, err);
	}
	free(ranges);
	if (mem)
		kiln__owned_free(mem, mem_len);
	free(own);
	return rc;
}
