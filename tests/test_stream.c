/* SPDX-License-Identifier: MIT */
/*
 * The one-call stream forms: kiln_tensor_read (one tensor through the stream engine) and
 * kiln_model_read_all (every byte of the block, for finding unreadable sectors). Every source gives
 * the writer's bytes; argument errors, cancellation, and EIO injected through src/base/sys.h at a
 * known offset, for both engines; pread's gathered calls (neighbouring chunks in one preadv):
 * counted, bounded by their window and gap, and finished or read again chunk by chunk when a call
 * comes back short or fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"
#include "io/engine.h"

#define NT 7
static uint8_t *data[NT];
static kiln_tensor_spec spec[NT];
static blob file; /* the block as written: what every read must give back */
static char *path;

/* Odd lengths leave gaps between payloads; one tensor spans dozens of 64 KiB chunks; the last is
 * an odd-count 4-bit tensor (5 elements in 3 bytes). */
static const uint64_t sizes[NT] = {3, 0, 4097, 65536 + 100, 700001, 777, 3};

static void make_file(void)
{
	uint64_t x = 7;
	for (int i = 0; i < NT; i++) {
		data[i] = malloc(sizes[i] ? sizes[i] : 1);
		fill_random(data[i], sizes[i], &x);
		spec[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizes[i]}, .data = data[i]};
	}
	data[NT - 1][2] &= 0x0F; /* the unused high nibble must be zero */
	spec[NT - 1].dtype = KILN_DT_I4;
	spec[NT - 1].shape[0] = 5;
	file = build(spec, NT);
	path = write_temp(file.p, file.len);
}

static void drop_file(void)
{
	kiln__sys = kiln__sys_default;
	unlink(path);
	free(path);
	blob_free(&file);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

TestSuite(tensor_read, .init = make_file, .fini = drop_file);
TestSuite(read_all, .init = make_file, .fini = drop_file);

/* Open through `source`; BUFFER parses the in-memory copy. */
static kiln_model *open_src(unsigned source)
{
	kiln_model *dir;
	kiln_error err;
	int rc;
	if (source == KILN_SOURCE_BUFFER) {
		rc = kiln_model_parse(file.p, file.len, NULL, &dir, &err);
	} else {
		kiln_open_options o = {.source = source};
		rc = kiln_model_open(path, &o, &dir, &err);
	}
	cr_assert_eq(rc, 0, "%s: %s", kiln_source_name(source), err.message);
	return dir;
}

/* --- kiln_tensor_read ------------------------------------------------------------------------ */

struct seen {
	uint64_t tensor;
	uint64_t bytes, chunks, cancel_after;
	const uint8_t *dst; /* where the tensor lands: each chunk must be in place */
	int bad;
};

static int count_chunk(void *ctx, const kiln_chunk *c)
{
	struct seen *s = ctx;
	if (c->tensor != s->tensor || c->file != 0 || c->offset + c->length > sizes[s->tensor] ||
	    c->data != s->dst + c->offset ||
	    memcmp(c->data, data[s->tensor] + c->offset, c->length) != 0)
		s->bad = 1;
	s->bytes += c->length;
	s->chunks++;
	return s->cancel_after && s->chunks >= s->cancel_after;
}

Test(tensor_read, every_source_gives_the_writers_bytes)
{
	for (unsigned src = 0; src <= KILN_SOURCE_URING; src++) {
		kiln_model *dir = open_src(src);
		for (uint32_t i = 0; i < NT; i++) {
			uint8_t *raw = malloc(sizes[i] + 1);
			uint8_t *dst = raw + 1; /* any alignment */
			struct seen s = {.tensor = i, .dst = dst};
			kiln_error err;
			cr_assert_eq(kiln_tensor_read(dir, i, dst, sizes[i], count_chunk, &s, &err),
				     0, "%s #%u: %s", kiln_source_name(src), i, err.message);
			cr_assert_eq(memcmp(dst, data[i], sizes[i]), 0, "%s #%u",
				     kiln_source_name(src), i);
			cr_assert_eq(s.bad, 0, "%s #%u: a chunk was misplaced",
				     kiln_source_name(src), i);
			cr_assert_eq(s.bytes, sizes[i], "every byte is reported once");
			/* Without a callback too. */
			memset(dst, 0, sizes[i]);
			cr_assert_eq(kiln_tensor_read(dir, i, dst, sizes[i], NULL, NULL, NULL), 0);
			cr_assert_eq(memcmp(dst, data[i], sizes[i]), 0);
			free(raw);
		}
		kiln_model_close(dir);
	}
}

Test(tensor_read, argument_errors)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	uint8_t *buf = malloc(sizes[4]);
	kiln_error err;
	cr_assert_eq(kiln_tensor_read(dir, 4, buf, sizes[4] - 1, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, 4);
	cr_assert_eq(kiln_tensor_read(dir, 4, NULL, sizes[4], NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_read(dir, NT, buf, sizes[4], NULL, NULL, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "out of range"), "%s", err.message);
	cr_assert_eq(kiln_tensor_read(dir, UINT32_MAX, buf, sizes[4], NULL, NULL, &err),
		     KILN_INVAL);
	cr_assert_eq(kiln_tensor_read(dir, KILN_NO_INDEX, buf, sizes[4], NULL, NULL, &err),
		     KILN_INVAL);
	cr_assert_eq(kiln_tensor_read(dir, (uint64_t)1 << 32, buf, sizes[4], NULL, NULL, &err),
		     KILN_INVAL, "an index is not cut to 32 bits");
	cr_assert_eq(kiln_tensor_read(NULL, 0, buf, sizes[4], NULL, NULL, &err), KILN_INVAL);
	/* An empty tensor needs no destination. */
	cr_assert_eq(kiln_tensor_read(dir, 1, NULL, 0, NULL, NULL, &err), 0, "%s", err.message);
	free(buf);
	kiln_model_close(dir);
}

Test(tensor_read, a_callback_that_says_stop_cancels)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	uint8_t *buf = malloc(sizes[4]);
	struct seen s = {.tensor = 4, .dst = buf, .cancel_after = 1};
	kiln_error err;
	/* 700001 bytes fit one default 4 MiB chunk: a stop from the only callback still says
	 * CANCELED, since the caller asked not to go on. */
	cr_assert_eq(kiln_tensor_read(dir, 4, buf, sizes[4], count_chunk, &s, &err), KILN_CANCELED);
	cr_assert_eq(s.chunks, 1, "no callback after the one that said stop");
	free(buf);
	kiln_model_close(dir);
}

/* --- kiln_model_read_all ------------------------------------------------------------------- */

struct cover {
	uint8_t *copy;  /* what the chunks carried, by block offset */
	uint8_t *times; /* how often each byte was delivered */
	uint64_t chunks, cancel_after;
	int bad;
};

static int cover_chunk(void *ctx, const kiln_chunk *c)
{
	struct cover *v = ctx;
	if (c->tensor != KILN_NO_INDEX || c->file != 0 || c->offset + c->length > file.len) {
		v->bad = 1;
	} else {
		memcpy(v->copy + c->offset, c->data, c->length);
		for (uint64_t k = 0; k < c->length; k++)
			v->times[c->offset + k]++;
	}
	v->chunks++;
	return v->cancel_after && v->chunks >= v->cancel_after;
}

/* Every byte of the block was delivered exactly once and equals the file's. */
static void expect_covered(const struct cover *v, const char *what)
{
	cr_assert_eq(v->bad, 0,
		     "%s: a chunk outside the block, with a tensor index or another file", what);
	for (size_t k = 0; k < file.len; k++)
		cr_assert_eq(v->times[k], 1, "%s: byte %zu delivered %u times", what, k,
			     v->times[k]);
	cr_assert_eq(memcmp(v->copy, file.p, file.len), 0, "%s: bytes differ", what);
}

static struct cover cover_new(void)
{
	struct cover v = {.copy = calloc(1, file.len), .times = calloc(1, file.len)};
	cr_assert(v.copy && v.times);
	return v;
}

static void cover_free(struct cover *v)
{
	free(v->copy);
	free(v->times);
}

Test(read_all, every_byte_once_from_every_source_and_engine)
{
	for (unsigned src = 0; src <= KILN_SOURCE_URING; src++) {
		for (unsigned engine = KILN_ENGINE_AUTO; engine <= KILN_ENGINE_PREAD; engine++) {
			for (int direct = 0; direct < 2; direct++) {
				char what[64];
				snprintf(what, sizeof(what), "%s engine %u direct %d",
					 kiln_source_name(src), engine, direct);
				kiln_model *dir = open_src(src);
				struct cover v = cover_new();
				kiln_stream_options o = {.engine = engine,
							 .chunk_size = 65536,
							 .on_chunk = cover_chunk,
							 .ctx = &v,
							 .flags = direct ? KILN_STREAM_DIRECT : 0};
				kiln_stream_result res;
				kiln_error err;
				cr_assert_eq(kiln_model_read_all(dir, &o, &res, &err), 0, "%s: %s",
					     what, err.message);
				expect_covered(&v, what);
				cr_assert_eq(res.bytes, file.len, "%s", what);
				cr_assert_eq(res.chunks, v.chunks, "%s", what);
				cr_assert_gt(res.chunks, 10, "%s: 64 KiB chunks", what);
				if (src != KILN_SOURCE_BUFFER)
					cr_assert_eq(res.direct, (uint32_t)direct, "%s", what);
				cover_free(&v);
				kiln_model_close(dir);
			}
		}
	}
}

static uint32_t reuses;
static int count_reuse(void *ctx, uint32_t buffer)
{
	(void)ctx;
	(void)buffer;
	reuses++;
	return 0;
}

Test(read_all, through_caller_staging_buffers_and_with_defaults)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	enum { NB = 2, BS = 128 * 1024 };
	void *ring[NB];
	for (int i = 0; i < NB; i++)
		ring[i] = aligned_alloc(4096, BS);
	struct cover v = cover_new();
	kiln_stream_options o = {.staging = ring,
				 .staging_count = NB,
				 .staging_size = BS,
				 .on_chunk = cover_chunk,
				 .before_reuse = count_reuse,
				 .ctx = &v};
	kiln_stream_result res;
	kiln_error err;
	reuses = 0;
	cr_assert_eq(kiln_model_read_all(dir, &o, &res, &err), 0, "%s", err.message);
	expect_covered(&v, "staging");
	cr_assert_geq(reuses, res.chunks - NB, "the caller's buffers were reused");
	cover_free(&v);
	for (int i = 0; i < NB; i++)
		free(ring[i]);
	/* No options, no callback: kiln's own buffers, every byte counted. */
	cr_assert_eq(kiln_model_read_all(dir, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.bytes, file.len);
	kiln_model_close(dir);
}

Test(read_all, argument_errors_and_cancel)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	kiln_error err;
	cr_assert_eq(kiln_model_read_all(NULL, NULL, NULL, &err), KILN_INVAL);
	void *ring[1] = {malloc(4096)};
	kiln_stream_options o = {.staging = ring, .staging_count = 0, .staging_size = 4096};
	cr_assert_eq(kiln_model_read_all(dir, &o, NULL, &err), KILN_INVAL);
	kiln_stream_options r = {.reserved = {1}};
	cr_assert_eq(kiln_model_read_all(dir, &r, NULL, &err), KILN_INVAL);
	kiln_stream_options e = {.engine = 9};
	cr_assert_eq(kiln_model_read_all(dir, &e, NULL, &err), KILN_INVAL);
	free(ring[0]);

	struct cover v = cover_new();
	v.cancel_after = 3;
	kiln_stream_options c = {.chunk_size = 65536, .on_chunk = cover_chunk, .ctx = &v};
	cr_assert_eq(kiln_model_read_all(dir, &c, NULL, &err), KILN_CANCELED);
	cr_assert_eq(v.chunks, 3, "no callback after the one that said stop");
	cover_free(&v);
	kiln_model_close(dir);
}

Test(read_all, a_file_truncated_after_open_is_io_not_sigbus)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
	cr_assert_eq(truncate(path, (off_t)info.payload_base + 1000), 0);
	kiln_error err;
	cr_assert_eq(kiln_model_read_all(dir, NULL, NULL, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_eq(err.file, 0);
	cr_assert_not_null(strstr(err.message, "ended"), "%s", err.message);
	kiln_model_close(dir);
}

/* --- an unreadable sector ----------------------------------------------------------------------
 */

/* The byte that cannot be read: inside tensor 4, well past the directory. */
static uint64_t bad_byte;

static int covers_bad(uint64_t off, size_t len)
{
	return off <= bad_byte && bad_byte < off + len;
}

static ssize_t eio_pread(int fd, void *buf, size_t len, off_t off)
{
	if (covers_bad((uint64_t)off, len)) {
		errno = EIO;
		return -1;
	}
	return pread(fd, buf, len, off);
}

static int eio_result(int res, int fd, uint64_t off, size_t len)
{
	(void)fd;
	return covers_bad(off, len) ? -EIO : res;
}

Test(read_all, an_unreadable_sector_is_io_at_its_offset)
{
	kiln_model *dir = open_src(KILN_SOURCE_MMAP);
	const kiln_tensor *t = kiln_model_tensor(dir, 4);
	bad_byte = t->file_offset + 300000;
	uint64_t chunk_start = bad_byte / 65536 * 65536; /* chunks sit at multiples of their size */
	for (unsigned engine = KILN_ENGINE_URING; engine <= KILN_ENGINE_PREAD; engine++) {
		kiln__sys.pread = eio_pread;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = eio_result;
		struct cover v = cover_new();
		kiln_stream_options o = {.engine = engine,
					 .chunk_size = 65536,
					 .queue_depth = 4,
					 .on_chunk = cover_chunk,
					 .ctx = &v};
		kiln_stream_result res;
		kiln_error err;
		cr_assert_eq(kiln_model_read_all(dir, &o, &res, &err), KILN_IO, "engine %u",
			     engine);
		kiln__sys = kiln__sys_default;
		cr_assert_eq(err.sys_errno, EIO);
		cr_assert_eq(err.file, 0, "engine %u: the error names the file", engine);
		char want[64];
		snprintf(want, sizeof(want), "at offset %llu failed",
			 (unsigned long long)chunk_start);
		cr_assert_not_null(strstr(err.message, want), "engine %u: '%s' lacks '%s'", engine,
				   err.message, want);
		cr_assert_eq(v.times[bad_byte], 0, "the unreadable byte was never delivered");
		cr_assert_lt(res.bytes, file.len);
		cover_free(&v);
	}
	/* The same directory reads cleanly once the fault is gone. */
	kiln_stream_result res;
	cr_assert_eq(kiln_model_read_all(dir, NULL, &res, NULL), 0);
	cr_assert_eq(res.bytes, file.len);
	kiln_model_close(dir);
}

/* --- gathered reads ---------------------------------------------------------------------------
 * Buffered pread into the caller's memory reads neighbouring chunks of one window with one
 * preadv (src/io/engine.c, run_preadv), at most 64 a call. A file of 100 tensors of 1000 bytes
 * (24 bytes of padding after each), but the 21st of 8192, so that leaving it out leaves a gap
 * wider than the 4 KiB a call reads through. */
#define GN   100
#define GBIG 20
static uint8_t *gdata[GN];
static blob gfile;
static char *gpath;
static long n_preadv, n_pread, preadv_max_bytes, short_to;
static int preadv_errno;

static ssize_t count_pread(int fd, void *buf, size_t len, off_t off)
{
	n_pread++;
	return pread(fd, buf, len, off);
}

/* Counts calls and the bytes each asks for; short_to cuts a call short, preadv_errno fails it. */
static ssize_t count_preadv(int fd, const struct iovec *iov, int n, off_t off)
{
	n_preadv++;
	long want = 0;
	for (int i = 0; i < n; i++)
		want += (long)iov[i].iov_len;
	if (want > preadv_max_bytes)
		preadv_max_bytes = want;
	if (preadv_errno) {
		errno = preadv_errno;
		return -1;
	}
	if (short_to) {
		struct iovec cut[256];
		long left = short_to;
		int k = 0;
		for (; k < n && left > 0 && k < 256; k++) {
			cut[k] = iov[k];
			if ((long)cut[k].iov_len > left)
				cut[k].iov_len = (size_t)left;
			left -= (long)cut[k].iov_len;
		}
		return preadv(fd, cut, k, off);
	}
	return preadv(fd, iov, n, off);
}

static void make_gathered(void)
{
	kiln_tensor_spec s[GN];
	uint64_t x = 11;
	for (int i = 0; i < GN; i++) {
		uint64_t len = i == GBIG ? 8192 : 1000;
		gdata[i] = malloc(len);
		fill_random(gdata[i], len, &x);
		s[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {len}, .data = gdata[i]};
	}
	gfile = build(s, GN);
	gpath = write_temp(gfile.p, gfile.len);
}

static void drop_gathered(void)
{
	kiln__sys = kiln__sys_default;
	unlink(gpath);
	free(gpath);
	blob_free(&gfile);
	for (int i = 0; i < GN; i++)
		free(gdata[i]);
}

TestSuite(gathered, .init = make_gathered, .fini = drop_gathered);

/* From here until kiln__sys is reset: the file's reads counted through the fakes above. */
static void count_calls(void)
{
	n_preadv = n_pread = preadv_max_bytes = 0;
	kiln__sys.pread = count_pread;
	kiln__sys.preadv = count_preadv;
}

/* kiln_stream of `list` (NULL: every tensor, n of them) into fresh 8 KiB destinations, its reads
 * counted; the destinations in dst. */
static int counted_stream(const kiln_model *m, const uint64_t *list, size_t n, void **dst,
			  const kiln_stream_options *o, kiln_stream_result *res, kiln_error *err)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = calloc(1, 8192);
	count_calls();
	int rc = kiln_stream(m, list, n, dst, o, res, err);
	kiln__sys = kiln__sys_default;
	return rc;
}

/* Each destination holds its tensor's bytes; then freed. */
static void check_and_free(const uint64_t *list, size_t n, void **dst)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t t = list ? list[i] : i;
		cr_assert_eq(memcmp(dst[i], gdata[t], t == GBIG ? 8192 : 1000), 0, "tensor %llu",
			     (unsigned long long)t);
		free(dst[i]);
	}
}

/* Stream `list` (NULL: every tensor) with pread and chunk_size `chunk`, counting the calls; every
 * tensor's bytes checked. */
static kiln_stream_result gather_stream(const uint64_t *list, size_t count, uint32_t chunk)
{
	kiln_model *m;
	kiln_error err;
	kiln_open_options oo = {.source = KILN_SOURCE_MMAP};
	cr_assert_eq(kiln_model_open(gpath, &oo, &m, &err), 0, "%s", err.message);
	size_t n = list ? count : GN;
	void *dst[GN];
	kiln_stream_options o = {.engine = KILN_ENGINE_PREAD, .chunk_size = chunk};
	kiln_stream_result res;
	int rc = counted_stream(m, list, n, dst, &o, &res, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	cr_assert_eq(res.engine, KILN_ENGINE_PREAD);
	check_and_free(list, n, dst);
	kiln_model_close(m);
	return res;
}

Test(gathered, neighbours_in_one_call)
{
	kiln_stream_result res = gather_stream(NULL, 0, 1u << 20);
	cr_assert_eq(n_preadv, 2,
		     "107 KiB of neighbours in a 1 MiB window, at most 64 chunks a "
		     "call: %ld calls",
		     n_preadv);
	cr_assert_eq(n_pread, 0);
	cr_assert_eq(res.chunks, GN, "each tensor still lands as its own chunk");
	cr_assert_eq(res.retries, 0);
}

Test(gathered, a_wide_gap_or_a_step_back_starts_a_new_call)
{
	/* Tensors 0-19 and 21-99 in 1 MiB: calls of 20 chunks, then 64, then 15. */
	uint64_t list[GN - 1];
	for (uint64_t i = 0, k = 0; i < GN; i++)
		if (i != GBIG)
			list[k++] = i;
	gather_stream(list, GN - 1, 1u << 20);
	cr_assert_eq(n_preadv, 3, "8 KiB left out between two runs: %ld calls", n_preadv);
	for (uint64_t i = 0; i < 30; i++)
		list[i] = 29 - i; /* tensors 29, 28, ..., 0 */
	gather_stream(list, 30, 1u << 20);
	cr_assert_eq(n_preadv, 30, "backwards, every tensor is a call: %ld", n_preadv);
}

Test(gathered, a_call_stays_in_its_window)
{
	/* 4 KiB chunks: one call for each 4 KiB window of the file that payload bytes touch. */
	kiln_model *m;
	cr_assert_eq(kiln_model_open(gpath, NULL, &m, NULL), 0);
	uint64_t windows = 0, last = UINT64_MAX;
	for (uint64_t i = 0; i < GN; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		for (uint64_t w = t->file_offset / 4096;
		     w <= (t->file_offset + t->byte_length - 1) / 4096; w++)
			if (w != last)
				windows++, last = w;
	}
	kiln_model_close(m);
	gather_stream(NULL, 0, 4096);
	cr_assert_eq(n_preadv, (long)windows, "%ld calls for %llu windows", n_preadv,
		     (unsigned long long)windows);
	cr_assert_leq(preadv_max_bytes, 4096);
}

Test(gathered, a_short_call_is_finished_chunk_by_chunk)
{
	short_to = 2500; /* each call ends in its third tensor */
	kiln_stream_result res = gather_stream(NULL, 0, 1u << 20);
	short_to = 0;
	cr_assert_eq(res.retries, 2, "one retry a call cut short: %llu",
		     (unsigned long long)res.retries);
	cr_assert_eq(n_pread, GN - 4, "what the calls brought (two chunks each) is not read again");
}

Test(gathered, a_failed_call_is_read_again_chunk_by_chunk)
{
	/* An error names the chunk it is in (read_all's unreadable sector test); one that only the
	 * gathered call met is no error. EINTR the same way. */
	int errs[] = {EIO, EINTR};
	for (int i = 0; i < 2; i++) {
		preadv_errno = errs[i];
		kiln_stream_result res = gather_stream(NULL, 0, 1u << 20);
		preadv_errno = 0;
		cr_assert_eq(n_pread, GN, "errno %d: each chunk read on its own", errs[i]);
		cr_assert_eq(res.retries, 2, "errno %d: one retry a failed call", errs[i]);
	}
}

static int cancel_third(void *ctx, const kiln_chunk *c)
{
	(void)c;
	return ++*(int *)ctx == 3;
}

Test(gathered, a_stop_in_a_callback_ends_the_call_there)
{
	/* Every chunk of the call is in place before the first callback; none is told of after the
	 * third's said stop, and nothing more is read. */
	kiln_model *m;
	kiln_error err;
	kiln_open_options oo = {.source = KILN_SOURCE_MMAP};
	cr_assert_eq(kiln_model_open(gpath, &oo, &m, &err), 0, "%s", err.message);
	void *dst[GN];
	int seen = 0;
	kiln_stream_options o = {.engine = KILN_ENGINE_PREAD,
				 .chunk_size = 1u << 20,
				 .on_chunk = cancel_third,
				 .ctx = &seen};
	kiln_stream_result res;
	int rc = counted_stream(m, NULL, GN, dst, &o, &res, &err);
	cr_assert_eq(rc, KILN_CANCELED, "%s", err.message);
	cr_assert_eq(seen, 3, "callbacks after the stop: %d", seen - 3);
	cr_assert_eq(n_preadv, 1, "no call after the stop");
	cr_assert_eq(n_pread, 0);
	for (size_t i = 0; i < GN; i++)
		free(dst[i]);
	kiln_model_close(m);
}

Test(gathered, chunks_checked_as_they_land_are_read_one_a_call)
{
	/* With digests to check, each chunk is hashed right behind its own read: nothing gathered.
	 */
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(gpath, NULL, &m, &err), 0, "%s", err.message);
	kiln_digest_options d = {.size = sizeof(d), .chunk_log2 = 12};
	cr_assert_eq(kiln_model_write_digests(m, &d, NULL, &err), 0, "%s", err.message);
	kiln_model_close(m);
	kiln_open_options oo = {.flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	cr_assert_eq(kiln_model_open(gpath, &oo, &m, &err), 0, "%s", err.message);
	void *dst[GN];
	kiln_stream_options o = {.engine = KILN_ENGINE_PREAD, .chunk_size = 1u << 20};
	kiln_stream_result res;
	int rc = counted_stream(m, NULL, GN, dst, &o, &res, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	cr_assert_eq(n_preadv, 0, "checked reads gathered into %ld calls", n_preadv);
	cr_assert_geq(n_pread, GN);
	check_and_free(NULL, GN, dst);
	kiln_model_close(m);
	char *side = NULL;
	cr_assert_neq(asprintf(&side, "%s.kiln-digest", gpath), -1);
	unlink(side);
	free(side);
}

/* The engine itself (src/io/engine.h), for the cases a model's reads rarely make: two files
 * whose ranges lie within 4 KiB forward of each other, an empty range between neighbours, the
 * same bytes to two places. Both files are the gathered test's file. */
static int engine_reads(const struct kiln__range *g, size_t n)
{
	int fds[2] = {open(gpath, O_RDONLY | O_CLOEXEC), open(gpath, O_RDONLY | O_CLOEXEC)};
	cr_assert(fds[0] >= 0 && fds[1] >= 0);
	struct kiln__io io = {
	    .fds = fds, .nfds = 2, .chunk = 1u << 20, .qd = 4, .engine = KILN_ENGINE_PREAD};
	count_calls();
	kiln_error err;
	int rc = kiln__io_run(&io, g, n, &err);
	kiln__sys = kiln__sys_default;
	cr_assert_eq(rc, 0, "%s", err.message);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(memcmp(g[i].dst, gfile.p + g[i].off, (size_t)g[i].len), 0, "range %zu",
			     i);
	close(fds[0]);
	close(fds[1]);
	return (int)io.res.chunks;
}

Test(gathered, another_file_an_empty_range_and_the_same_bytes_twice)
{
	uint8_t a[1000], b[1000], c[1000];
	/* Another file 100 bytes on: a call of its own. */
	struct kiln__range g[3] = {{.off = 0, .len = 1000, .dst = a, .file = 0},
				   {.off = 1100, .len = 1000, .dst = b, .file = 1}};
	cr_assert_eq(engine_reads(g, 2), 2);
	cr_assert_eq(n_preadv, 2, "two files: %ld calls", n_preadv);
	/* An empty range between two neighbours: passed over, one call. */
	g[1] = (struct kiln__range){.off = 1000, .len = 0, .dst = b, .file = 0};
	g[2] = (struct kiln__range){.off = 1024, .len = 1000, .dst = c, .file = 0};
	cr_assert_eq(engine_reads(g, 3), 2);
	cr_assert_eq(n_preadv, 1, "an empty range between: %ld calls", n_preadv);
	/* The same bytes to two places: a call each, both filled. */
	g[1] = (struct kiln__range){.off = 0, .len = 1000, .dst = b, .file = 0};
	cr_assert_eq(engine_reads(g, 2), 2);
	cr_assert_eq(n_preadv, 2, "the same bytes twice: %ld calls", n_preadv);
}
