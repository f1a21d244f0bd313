/* SPDX-License-Identifier: MIT */
/*
 * Read once per group (kiln_group_load): the payload bytes of the list, laid end to end, are cut
 * into chunks; chunk c is read by rank c % world alone, and each round of `world` chunks is
 * exchanged with the caller's all-gather, so every rank ends with every byte and the group reads
 * the model once. Round k + 1 is read while round k is exchanged. Before any exchange the ranks
 * compare fingerprints of what they opened.
 *
 * Headers alike do not make payloads alike (two fine-tunes of one architecture), so the bytes
 * are checked too, without reading the model twice: each chunk travels with a digest of it
 * (XXH3-64) that every receiver checks (a collective that damages bytes), and every receiver
 * reads a sample of each chunk it receives from its own file and compares (a different file):
 * 4 KiB at an offset the chunk's digest picks, or the whole chunk with KILN_GROUP_VERIFY_ALL. A
 * mismatch is told to every rank at the next exchange, or at one last exchange of heads after
 * the rounds, so no rank returns success while another found one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "read/read.h"

/* What each rank opened, field by field so a mismatch can be named. */
struct print {
	uint64_t files, sizes, directory, versions, list, chunk, total, world;
};

static const char *const print_field[] = {
    "the number of files", "the file sizes", "the directory bytes", "the object versions (ETag)",
    "the tensor list",     "the chunk size", "the payload bytes",   "the world size"};

static int fingerprint(const kiln_model *m, const uint64_t *list, size_t count, uint32_t chunk,
		       uint64_t total, uint32_t world, struct print *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	p->files = m->nfiles;
	XXH3_state_t sz, dir, ver;
	XXH3_64bits_reset(&sz);
	XXH3_64bits_reset(&dir);
	XXH3_64bits_reset(&ver);
	for (uint32_t i = 0; i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		XXH3_64bits_update(&sz, &f->size, sizeof(f->size));
		/* The header and directory as the file has them: what the reader validated. */
		uint64_t n = f->payload_base < f->size ? f->payload_base : f->size;
		uint8_t *b = malloc(n ? (size_t)n : 1);
		if (!b)
			return kiln__nomem(err, 0, NULL);
		int rc = n ? kiln__file_read(f, 0, b, (size_t)n, err) : 0;
		if (!rc)
			XXH3_64bits_update(&dir, b, (size_t)n);
		free(b);
		if (rc)
			return rc;
		const char *etag = kiln__file_version(f);
		XXH3_64bits_update(&ver, etag, strlen(etag) + 1);
	}
	p->sizes = XXH3_64bits_digest(&sz);
	p->directory = XXH3_64bits_digest(&dir);
	p->versions = XXH3_64bits_digest(&ver);
	p->list = list ? XXH3_64bits(list, count * sizeof(*list)) : count;
	p->chunk = chunk;
	p->total = total;
	p->world = world;
	return 0;
}

/* The ranges of payload bytes [from, from + len) of the concatenated list, landing at dst
 * (consecutive), or at the destinations (dst NULL). `at` is the list position holding `from`
 * (advanced); ends[k] the end offset of position k in the concatenation. */
struct walk {
	const kiln_model *m;
	const uint64_t *list;
	const uint64_t *ends;
	size_t count;
	void *const *dests;
	struct kiln__range *ranges; /* room for the most a chunk can touch */
	int checked; /* the files keep chunk digests: received chunks are checked against them */
};

static size_t position_of(const struct walk *w, uint64_t off)
{
	size_t lo = 0, hi = w->count; /* first k with ends[k] > off */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (w->ends[mid] > off)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* Fill w->ranges for bytes [from, from + len); returns how many. */
static size_t ranges_of(const struct walk *w, uint64_t from, uint64_t len, uint8_t *dst)
{
	size_t n = 0;
	uint64_t done = 0;
	for (size_t k = position_of(w, from); done < len && k < w->count; k++) {
		const kiln_tensor *t = kiln_model_tensor(w->m, w->list ? w->list[k] : k);
		uint64_t start = w->ends[k] - t->byte_length, off = from + done - start;
		uint64_t take =
		    t->byte_length - off < len - done ? t->byte_length - off : len - done;
		if (!take)
			continue;
		w->ranges[n++] = (struct kiln__range){
		    .off = t->file_offset + off,
		    .len = take,
		    .dst = dst ? dst + done : (uint8_t *)w->dests[k] + off,
		    .tensor = t->index,
		    .tensor_off = off,
		    .file = t->file,
		};
		done += take;
	}
	return n;
}

/* Copy bytes [from, from + len) of the concatenation, held at src, to the destinations. */
static void scatter(const struct walk *w, uint64_t from, uint64_t len, const uint8_t *src)
{
	size_t n = ranges_of(w, from, len, NULL);
	uint64_t done = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(w->ranges[i].dst, src + done, (size_t)w->ranges[i].len);
		done += w->ranges[i].len;
	}
}

static int check(const kiln_collective *c, const kiln_group_options *o, kiln_error *err)
{
	if (!c || !c->all_gather || c->world == 0 || c->rank >= c->world)
		return kiln__fail_inval(err, KILN_NO_INDEX, "collective",
					"a collective needs all_gather and rank < world (rank %u, "
					"world %u)",
					c ? c->rank : 0, c ? c->world : 0);
	int rc = kiln__check_size("kiln_collective", c->size, sizeof(*c), err);
	if (!rc && o)
		rc = kiln__check_size("kiln_group_options", o->size, sizeof(*o), err);
	if (rc)
		return rc;
	if (o &&
	    (o->chunk_size > KILN__REQUEST_MAX ||
	     o->flags & ~(uint32_t)(KILN_LOAD_DIRECT | KILN_GROUP_VERIFY_ALL) || o->reserved32 ||
	     o->reserved[0] || o->reserved[1] || o->reserved[2] || o->reserved[3]))
		return kiln__fail_inval(err, KILN_NO_INDEX, "options",
					"kiln_group_options: chunk_size above 1 GiB, unknown flags "
					"or reserved fields not 0");
	return 0;
}

/* Each rank's slot in an exchange: whether it is still going, then its bytes. A rank that fails
 * still takes part once more, saying so, so the others stop too instead of waiting for it. */
#define HEAD 256u
struct head {
	int32_t code; /* 0: the bytes follow; else the failure's code */
	int32_t sys_errno;
	uint64_t digest; /* XXH3-64 of the bytes that follow */
	uint64_t tensor; /* the failure's tensor, or KILN_NO_INDEX */
	char message[HEAD - 24];
};

/* Bytes of each received chunk a rank compares with its own file: at most SAMPLE_SEG of each
 * tensor in it, at most about SAMPLE in all. */
#define SAMPLE     (64u << 10)
#define SAMPLE_SEG 256u

/* Send `len` bytes at slot + HEAD of `own` (and the head: `failed` with *err, or fine), receive
 * every rank's into `all` (W slots of HEAD + len). Returns 0, the collective's failure, or the
 * first failure another rank reported (an IO error naming it). */
static int exchange(const kiln_collective *c, uint8_t *own, uint8_t *all, size_t len, int failed,
		    const char *what, kiln_error *err)
{
	struct head h;
	memset(&h, 0, sizeof(h));
	h.digest = XXH3_64bits(own + HEAD, len);
	if (failed) {
		h.code = failed;
		h.sys_errno = err ? err->sys_errno : 0;
		h.tensor = err ? err->tensor : KILN_NO_INDEX;
		const char *msg = err ? err->message : "";
		size_t n = strnlen(msg, sizeof(h.message) - 1);
		memcpy(h.message, msg, n); /* as much of it as the head holds */
		h.message[n] = '\0';
	}
	memcpy(own, &h, sizeof(h));
	kiln_error e;
	memset(&e, 0, sizeof(e));
	if (c->all_gather(c->ctx, own, all, HEAD + len, &e)) {
		if (failed)
			return failed; /* ours is the error to report */
		if (e.code) {
			if (err)
				*err = e;
			return e.code;
		}
		return kiln__fail_sys(err, KILN_IO, 0, "rank %u: the all-gather of %s failed",
				      c->rank, what);
	}
	if (failed)
		return failed;
	for (uint32_t q = 0; q < c->world; q++) {
		memcpy(&h, all + (size_t)q * (HEAD + len), sizeof(h));
		if (h.code) {
			h.message[sizeof(h.message) - 1] = '\0';
			/* The class stays where it says what happened to the group (different
			 * checkpoints, memory); any other failure of a rank is IO to the others. */
			int code = h.code == KILN_NOMEM || h.code == KILN_INVAL ? h.code : KILN_IO;
			int rc = kiln__fail_sys(err, code, h.sys_errno, "rank %u failed: %s", q,
						h.message);
			if (err)
				err->tensor = h.tensor;
			return rc;
		}
	}
	return 0;
}

/* A mismatch at byte `pos` of the concatenation, found against rank q's bytes. */
static int differ(const struct walk *w, uint32_t q, uint64_t pos, kiln_error *err)
{
	size_t k = position_of(w, pos);
	const kiln_tensor *t = kiln_model_tensor(w->m, w->list ? w->list[k] : k);
	uint64_t off = pos - (w->ends[k] - t->byte_length);
	return kiln__fail_inval(
	    err, t->index, "group",
	    "rank %u's bytes of tensor \"%.*s\" differ from this rank's file at "
	    "byte %" PRIu64 " of the tensor: the ranks opened different checkpoints",
	    q, t->name ? (int)(t->name_len > 120 ? 120 : t->name_len) : 1, t->name ? t->name : "?",
	    off);
}

/* Check the chunk rank q sent (ql bytes at qf of the concatenation; its slot, head first, at
 * `slot`): the digest it travelled with, then bytes of it against this rank's own file, read
 * into buf: every byte when `all`, else up to SAMPLE_SEG bytes of each tensor it holds (of every
 * s-th tensor when there are more than SAMPLE / SAMPLE_SEG), at offsets the digest picks, so a
 * tensor that differs throughout is found whichever it is. 0; IO (damaged in the collective,
 * or our read failed); INVAL naming the first tensor and byte where the files differ. */
static int check_chunk(struct walk *w, const kiln_stream_options *so, uint32_t q, uint64_t qf,
		       uint64_t ql, uint64_t slot_len, const uint8_t *slot, int sample, int all,
		       uint8_t *buf, uint64_t *verified, kiln_error *err)
{
	const uint8_t *bytes = slot + HEAD;
	struct head h;
	memcpy(&h, slot, sizeof(h));
	uint64_t d = XXH3_64bits(bytes, (size_t)slot_len);
	if (d != h.digest)
		return kiln__fail_sys(err, KILN_IO, EBADMSG,
				      "rank %u's chunk at payload byte %" PRIu64
				      " arrived damaged through the collective (its digest "
				      "differs)",
				      q, qf);
	/* The ranges of the chunk, their dst pointing into the received bytes. */
	size_t n = ranges_of(w, qf, ql, (uint8_t *)bytes), k = 0;
	if (w->checked) {
		/* This rank's files keep chunk digests (a verifying directory-only open): the
		 * received bytes are checked against them, which finds a rank of another file as
		 * well as damage; the samples are not needed. */
		int rc = kiln__parts_check(w->m, w->ranges, n, verified, err);
		if (rc && err)
			kiln__error_prefix(err, "a chunk received from another rank");
		return rc;
	}
	if (!sample)
		return 0;
	size_t stride = all ? 1 : (n * SAMPLE_SEG + SAMPLE - 1) / SAMPLE;
	uint64_t used = 0;
	for (size_t i = stride > 1 ? (size_t)(d % stride) : 0; i < n; i += stride) {
		struct kiln__range r = w->ranges[i];
		uint64_t sl = all || r.len < SAMPLE_SEG ? r.len : SAMPLE_SEG;
		uint64_t at =
		    sl < r.len ? XXH3_64bits_withSeed(&i, sizeof(i), d) % (r.len - sl + 1) : 0;
		r.off += at;
		r.tensor_off += at;
		r.len = sl;
		r.dst += at; /* the received bytes, for now */
		w->ranges[k++] = r;
		used += sl;
	}
	/* Our own bytes are read into buf; theirs[j] keeps where range j's received bytes are. */
	const uint8_t **theirs = malloc((k ? k : 1) * sizeof(*theirs));
	if (!theirs)
		return kiln__nomem(err, k * sizeof(*theirs), "the samples");
	for (size_t j = 0, at = 0; j < k; j++) {
		theirs[j] = w->ranges[j].dst;
		w->ranges[j].dst = buf + at;
		at += (size_t)w->ranges[j].len;
	}
	kiln_stream_options plain = {.size = sizeof(plain)}; /* buffered: small, random */
	kiln_stream_result sr;
	int rc = kiln__stream_ranges(w->m, all ? so : &plain, w->ranges, k, NULL, 0, &sr, err);
	for (size_t j = 0; !rc && j < k; j++) {
		const struct kiln__range *r = &w->ranges[j];
		if (!memcmp(r->dst, theirs[j], (size_t)r->len))
			continue;
		uint64_t i = 0;
		while (r->dst[i] == theirs[j][i])
			i++;
		rc = differ(w, q, (uint64_t)(theirs[j] + i - bytes) + qf, err);
	}
	free(theirs);
	if (!rc)
		*verified += used;
	return rc;
}

/* The bytes rank `rank` reads in round k: [*from, *from + return) of the concatenation. */
static uint64_t mine_of(uint32_t rank, uint32_t W, uint32_t chunk, uint64_t nchunks, uint64_t total,
			uint64_t k, uint64_t *from)
{
	uint64_t mc = k * W + rank;
	*from = mc * chunk;
	return mc < nchunks ? (total - *from < chunk ? total - *from : chunk) : 0;
}

/* This rank's read of one round, on a thread of its own while the round before is exchanged:
 * the exchange (the network's time) and the read (the storage's) overlap. */
struct reader {
	const kiln_model *m;
	const kiln_stream_options *so;
	struct walk w; /* ranges of its own: the scatter of the round before uses the others */
	uint64_t from, len;
	uint8_t *dst;
	int rc;
	kiln_error err;
	pthread_t th;
	int threaded;
};

static void *read_round(void *arg)
{
	struct reader *r = arg;
	kiln__clear_error(&r->err);
	size_t n = ranges_of(&r->w, r->from, r->len, r->dst);
	kiln_stream_result sr;
	/* Not on a core of its own: the calling thread checks and scatters what it receives. */
	r->rc = kiln__stream_ranges(r->m, r->so, r->w.ranges, n, NULL, 0, &sr, &r->err);
	return NULL;
}

/* Start reading [from, from + len) into dst: on a thread, or here when none can start. */
static void read_start(struct reader *r, uint64_t from, uint64_t len, uint8_t *dst)
{
	r->from = from;
	r->len = len;
	r->dst = dst;
	r->rc = 0;
	r->threaded = len && pthread_create(&r->th, NULL, read_round, r) == 0;
	if (len && !r->threaded)
		read_round(r);
}

static int read_finish(struct reader *r)
{
	if (r->threaded)
		pthread_join(r->th, NULL);
	r->threaded = 0;
	return r->rc;
}

KILN_API int kiln_group_load(const kiln_model *m, const uint64_t *tensors, size_t count,
			     void *const *dests, const kiln_collective *c,
			     const kiln_group_options *o, kiln_group_result *res, kiln_error *err)
{
	kiln__clear_error(err);
	kiln_group_result r;
	memset(&r, 0, sizeof(r));
	if (res)
		*res = r;
	int rc = check(c, o, err);
	if (!rc && (!m || !dests))
		rc = kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model or destinations NULL");
	if (rc)
		return rc;
	if (!tensors)
		count = (size_t)m->count;
	uint32_t chunk = o && o->chunk_size ? o->chunk_size : KILN__GROUP_CHUNK_DEFAULT,
		 W = c->world;
	uint64_t *ends = calloc(count ? count : 1, sizeof(*ends)), total = 0;
	if (!ends)
		return kiln__nomem(err, 0, NULL);
	for (size_t k = 0; k < count; k++) {
		uint64_t i = tensors ? tensors[k] : k;
		const kiln_tensor *t = kiln_model_tensor(m, i);
		if (!t || (!dests[k] && t->byte_length)) {
			free(ends);
			return t ? kiln__fail_inval(err, i, NULL, "destination %zu is NULL", k)
				 : kiln__fail_inval(err, i, NULL,
						    "tensor index %" PRIu64 " is out of range", i);
		}
		total += t->byte_length;
		ends[k] = total;
	}

	/* Everyone opened the same thing, or nobody exchanges a byte. */
	uint8_t *pown = calloc(1, HEAD + sizeof(struct print)),
		*pall = calloc(W, HEAD + sizeof(struct print));
	if (!pown || !pall) {
		free(pown);
		free(pall);
		free(ends);
		return kiln__nomem(err, 0, NULL);
	}
	struct print mine;
	int failed = fingerprint(m, tensors, count, chunk, total, W, &mine, err);
	memcpy(pown + HEAD, &mine, sizeof(mine));
	rc = exchange(c, pown, pall, sizeof(mine), failed, "the fingerprints", err);
	for (uint32_t q = 0; !rc && q < W; q++) {
		uint64_t a[sizeof(mine) / sizeof(uint64_t)], b[sizeof(mine) / sizeof(uint64_t)];
		memcpy(a, pall + HEAD, sizeof(a));
		memcpy(b, pall + (size_t)q * (HEAD + sizeof(mine)) + HEAD, sizeof(b));
		for (size_t f = 0; f < sizeof(a) / sizeof(a[0]); f++)
			if (a[f] != b[f]) {
				rc = kiln__fail_inval(
				    err, KILN_NO_INDEX, "group",
				    "rank %u opened a different model from rank 0: "
				    "%s differ",
				    q, print_field[f]);
				break;
			}
	}
	free(pown);
	free(pall);

	/* The most ranges a chunk makes: the positions [a, b] it touches, the most of any. */
	struct walk w = {.m = m,
			 .list = tensors,
			 .ends = ends,
			 .count = count,
			 .dests = dests,
			 .checked = kiln__parts_kept(m)};
	uint64_t nchunks = total ? (total + chunk - 1) / chunk : 0, rounds = (nchunks + W - 1) / W;
	size_t most = 0;
	for (uint64_t ch = 0; !rc && ch < nchunks; ch++) {
		uint64_t last = (ch + 1) * chunk < total ? (ch + 1) * chunk - 1 : total - 1;
		size_t a = position_of(&w, ch * chunk), b = position_of(&w, last);
		if (b - a + 1 > most)
			most = b - a + 1;
	}
	/* Two slots of this rank's own (one read while the other is exchanged) and the world's. */
	uint8_t *own[2] = {NULL, NULL}, *got = NULL;
	size_t slot = HEAD + (size_t)chunk;
	struct reader rd = {.m = m, .w = w};
	if (!rc && nchunks) {
		own[0] = kiln__owned_alloc(slot);
		own[1] = kiln__owned_alloc(slot);
		got = kiln__owned_alloc(slot * W);
		w.ranges = calloc(most, sizeof(*w.ranges));
		rd.w.ranges = calloc(most, sizeof(*rd.w.ranges));
		if (!own[0] || !own[1] || !got || !w.ranges || !rd.w.ranges)
			rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					    "cannot allocate %u x %zu bytes for the exchange",
					    W + 2, slot);
		r.staging_bytes = (uint64_t)slot * (W + 2);
	}
	/* The kernel's read-ahead would read past a chunk into the next rank's: each byte would be
	 * read twice between the ranks (1.36x the file for two). */
	for (uint32_t i = 0; !rc && i < m->nfiles; i++)
		kiln__file_advise(&m->files[i], 0, 0, KILN__ADVISE_RANDOM);
	kiln_stream_options so = {.size = sizeof(so),
				  .flags =
				      o && (o->flags & KILN_LOAD_DIRECT) ? KILN_STREAM_DIRECT : 0};
	rd.so = &so;
	/* The samples of each received chunk, read from this rank's own file. A URL's object is
	 * the one its ETag names, and the ETags were compared: no second GET for it. */
	int all = o && (o->flags & KILN_GROUP_VERIFY_ALL), sampled = W > 1;
	for (uint32_t i = 0; i < m->nfiles && !all; i++)
		if (kiln__file_version(&m->files[i])[0])
			sampled = 0;
	size_t scap = all ? chunk : SAMPLE + SAMPLE_SEG;
	uint8_t *sample = !rc && nchunks && sampled ? malloc(scap) : NULL;
	if (!rc && nchunks && sampled && !sample)
		rc = kiln__nomem(err, scap, "the sample buffer");
	kiln_error found; /* a mismatch this rank found, for the others at the next exchange */
	int pending = 0;
	uint64_t from, len;
	if (!rc && rounds) {
		len = mine_of(c->rank, W, chunk, nchunks, total, 0, &from);
		read_start(&rd, from, len, own[0] + HEAD);
	}
	for (uint64_t k = 0; !rc && k < rounds; k++) {
		failed = read_finish(&rd);
		if (failed && err)
			*err = rd.err;
		else if (!failed)
			r.bytes_read += rd.len;
		if (!failed && pending) {
			failed = pending;
			if (err)
				*err = found;
		}
		if (!failed && k + 1 < rounds) {
			uint64_t nf, nl = mine_of(c->rank, W, chunk, nchunks, total, k + 1, &nf);
			read_start(&rd, nf, nl, own[(k + 1) & 1] + HEAD);
		}
		/* Every rank passes a whole slot (the last ones padded): one size for all. */
		rc = exchange(c, own[k & 1], got, chunk, failed, "a chunk", err);
		for (uint32_t q = 0; !rc && q < W; q++) {
			uint64_t qc = k * W + q, qf = qc * chunk;
			if (qc >= nchunks)
				continue;
			uint64_t ql = total - qf < chunk ? total - qf : chunk;
			const uint8_t *qs = got + (size_t)q * slot;
			if (q != c->rank && !pending)
				pending = check_chunk(&w, &so, q, qf, ql, chunk, qs, sampled, all,
						      sample, &r.bytes_verified, &found);
			scatter(&w, qf, ql, qs + HEAD);
			if (q != c->rank)
				r.bytes_received += ql;
		}
		r.rounds++;
	}
	/* The verdict: a mismatch found in the last round reaches every rank too. */
	if (!rc && rounds && W > 1) {
		if (pending && err)
			*err = found;
		rc = exchange(c, own[0], got, 0, pending, "the verdict", err);
	}
	free(sample);
	read_finish(&rd); /* the read of a round whose exchange did not happen */
	for (uint32_t i = 0; i < m->nfiles; i++)
		kiln__file_advise(&m->files[i], 0, 0, KILN__ADVISE_NORMAL);
	kiln__owned_free(own[0], slot);
	kiln__owned_free(own[1], slot);
	kiln__owned_free(got, slot * W);
	free(w.ranges);
	free(rd.w.ranges);
	free(ends);
	if (res)
		*res = r;
	return rc;
}
