/* SPDX-License-Identifier: MIT */
/*
 * The lifecycle of a model, on top of what it uses: options, open (the resolver's list of files,
 * each through its source and its format's reader), parse (a caller's buffer), payload
 * verification, info, close.
 *
 * Opening: the resolver (src/model/resolve.c) turns the caller's names into the model's files;
 * each file's source attaches it (src/source/); its first bytes say its format (or the caller
 * did: src/format/registry.c); the format's reader validates the header and directory through
 * the source and adds its tensors to the model's one index (src/index/); the source finishes
 * (maps, reads the payload); the views are bound to the file's memory. A model of several files
 * is the same, file by file, into one index and one name table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "format/format.h"
#include "index/meta.h"
#include "model/model.h"
#include "model/resolve.h"
#include "net/net.h"
#include "base/sys.h"
#include "format/digest.h"
#include "read/read.h"

static int check_options(const kiln_open_options *opts, kiln_error *err)
{
	if (!opts)
		return 0;
	int rc = kiln__check_size("kiln_open_options", opts->size, sizeof(*opts), err);
	if (rc)
		return rc;
	const uint32_t known = KILN_OPEN_VERIFY_PAYLOAD | KILN_OPEN_ALLOW_TRAILING |
			       KILN_OPEN_POPULATE | KILN_OPEN_LOCK | KILN_OPEN_HUGEPAGE |
			       KILN_OPEN_DIRECT | KILN_OPEN_PRIVATE | KILN_OPEN_ONE_FILE |
			       KILN_OPEN_ALIGN | KILN_OPEN_DIRECTORY_ONLY |
			       KILN_OPEN_VERIFY_DIGESTS | KILN_OPEN_PACK_VIEWS;
	if (opts->flags & ~known)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown open flags 0x%x",
					opts->flags & ~known);
	if ((opts->flags & KILN_OPEN_PACK_VIEWS) && opts->allocator)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_OPEN_PACK_VIEWS keeps the views in kiln's own memory; "
		    "a caller's allocator is given the whole index");
	/* Every page of a writable private mapping is copied when it is locked. */
	if ((opts->flags & KILN_OPEN_PRIVATE) && (opts->flags & KILN_OPEN_LOCK))
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags",
					"KILN_OPEN_PRIVATE with KILN_OPEN_LOCK would copy every "
					"page of the file into memory");
	const uint32_t of_payload =
	    KILN_OPEN_POPULATE | KILN_OPEN_LOCK | KILN_OPEN_PRIVATE | KILN_OPEN_ALIGN;
	if ((opts->flags & KILN_OPEN_DIRECTORY_ONLY) &&
	    ((opts->flags & of_payload) || opts->buffer))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_OPEN_DIRECTORY_ONLY leaves the payload where it is: "
		    "POPULATE, LOCK, PRIVATE, ALIGN and a load buffer are about "
		    "its memory");
	if (opts->source > KILN_SOURCE_AUTO)
		return kiln__fail_inval(err, KILN_NO_INDEX, "source", "unknown source %u",
					opts->source);
	if (opts->advice > KILN_ADVICE_WILLNEED)
		return kiln__fail_inval(err, KILN_NO_INDEX, "advice", "unknown advice %u",
					opts->advice);
	if (opts->chunk_size > KILN__REQUEST_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "chunk_size",
					"chunk_size %u is above 1 GiB", opts->chunk_size);
	if (opts->queue_depth > KILN__QD_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "queue_depth",
					"queue_depth %u is above %u", opts->queue_depth,
					KILN__QD_MAX);
	if (opts->threads > KILN__THREADS_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "threads", "threads %u is above %u",
					opts->threads, KILN__THREADS_MAX);
	if (opts->format > KILN_FORMAT_SAFETENSORS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "format", "unknown format %u",
					opts->format);
	for (size_t i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
						"kiln_open_options.reserved[%zu] is not 0", i);
	if ((rc = kiln__remote_check_options(opts->remote, err)))
		return rc;
	const kiln_allocator *a = opts->allocator;
	if (a && (!a->alloc || !a->free))
		return kiln__fail_inval(err, KILN_NO_INDEX, "allocator",
					"an allocator needs both alloc and free");
	return 0;
}

/* A model of no files yet, with the allocator of opts. NULL with NOMEM in *err. */
static struct kiln_model *model_new(const kiln_open_options *opts, kiln_error *err)
{
	kiln_allocator a = kiln__default_allocator;
	if (opts && opts->allocator)
		a = *opts->allocator;
	struct kiln_model *m = a.alloc(a.ctx, sizeof(*m));
	if (!m) {
		kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate a model handle");
		return NULL;
	}
	memset(m, 0, sizeof(*m));
	m->alloc = a;
	m->one_file = opts && (opts->flags & KILN_OPEN_ONE_FILE);
	kiln__hash_key(m->secret);
	pthread_mutex_init(&m->meta_lock, NULL);
	m->copy_tensor = kiln_tensor_copy;
	return m;
}

/* --- close ----------------------------------------------------------------------------------- */

void kiln_model_close(kiln_model *m)
{
	if (!m)
		return;
	/* Registrations first: no pin hook may outlive the memory it registered. */
	kiln__pins_release(m);
	kiln__index_free(m);
	for (uint32_t i = 0; m->files && i < m->nfiles; i++) {
		kiln__verifier_free(m->files[i].parts);
		kiln__file_release(&m->files[i]);
	}
	if (m->files && m->files != &m->one)
		kiln__free(&m->alloc, m->files, (size_t)m->nfiles * sizeof(*m->files));
	if (m->realign_mem)
		kiln__owned_free(m->realign_mem, m->realign_len);
	kiln__meta_free(m);
	pthread_mutex_destroy(&m->meta_lock);
	kiln_allocator a = m->alloc;
	a.free(a.ctx, m, sizeof(*m));
}

int kiln_model_try_close(kiln_model *m, kiln_error *err)
{
	kiln__clear_error(err);
	if (m && m->pinned)
		return kiln__fail(err, KILN_BUSY, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "%" PRIu32 " pinned range(s) are still registered; unpin them "
				  "first",
				  m->pinned);
	kiln_model_close(m);
	return 0;
}

/* --- opening -----------------------------------------------------------------------------------
 */

/* Name the file in an error from a model of several files: the reader's message names none. */
static void name_file(const struct kiln__file *f, kiln_error *err)
{
	if (f->path && f->model->nfiles > 1)
		kiln__error_prefix(err, kiln__file_shown(f));
}

/* The source brings the file's payload in; with KILN_OPEN_VERIFY_DIGESTS every byte is checked
 * against the file's digests as it lands. */
static int finish_file(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	if (!o || !(o->flags & KILN_OPEN_VERIFY_DIGESTS))
		return kiln__file_finish(f, o, err);
	struct kiln__verifier *v;
	int rc = kiln__verifier_open(f->model, f, &v, err);
	if (rc)
		return rc;
	f->landed = kiln__verifier_landed;
	f->landed_ctx = v;
	/* A source that reads on one thread hashes on another core, which then reads on while
	 * the hash runs; with reader threads (o->threads) the cores are theirs already. */
	if (o->threads <= 1 && kiln__online_cpus() > 1)
		kiln__verifier_start(v);
	uint64_t chunks = 0;
	rc = kiln__file_finish(f, o, err);
	if (!rc)
		rc = kiln__verifier_finish(v, &chunks, err);
	f->landed = NULL;
	f->landed_ctx = NULL;
	const struct kiln__digests *d = kiln__verifier_chunks(v);
	f->model->digest_chunks += chunks;
	if (!rc)
		f->model->digest_bytes += d ? d->to - d->from : f->size;
	kiln__verifier_free(v);
	return rc;
}

/* A directory-only open with KILN_OPEN_VERIFY_DIGESTS: the file's chunk digests kept, and every
 * read of it checks the parts it lands (src/read/parts.c). */
static int keep_digests(struct kiln__file *f, kiln_error *err)
{
	struct kiln__verifier *v;
	int rc = kiln__verifier_open(f->model, f, &v, err);
	if (rc)
		return rc;
	if (!kiln__verifier_chunks(v)) {
		const char *source = kiln_digest_source_name(kiln__verifier_source(v));
		kiln__verifier_free(v);
		rc = kiln__fail_named(err, kiln__file_shown(f), KILN_UNSUPPORTED, KILN_NO_INDEX,
				      "digests", KILN_NO_OFFSET,
				      "its %s digests hash whole files, not parts; open it whole "
				      "or make chunk digests with klnt digest",
				      source);
		kiln__error_file(err, f->no);
		return rc;
	}
	f->parts = v;
	return 0;
}

/* Attach, read and finish file f: its path set by the resolver, or the caller's buffer when
 * `buffer`. */
static int open_file(struct kiln__file *f, const kiln_open_options *o, int buffer, const void *buf,
		     size_t len, int exact, kiln_error *err)
{
	struct kiln_model *m = f->model;
	int rc = kiln__file_attach(f, o, buffer, buf, len, err);
	if (rc) {
		if (rc == KILN_IO && err && err->sys_errno == ENOENT && m->nfiles > 1)
			snprintf(err->message, sizeof(err->message),
				 "%s: shard %" PRIu32 " of %" PRIu32 " is missing",
				 kiln__file_shown(f), f->no + 1, m->nfiles);
		return rc;
	}
	f->first = m->count;
	if ((rc = kiln__format_of(f, o ? o->format : KILN_FORMAT_AUTO, &f->fmt, err))) {
		if (kiln_is_format_error(rc))
			name_file(f, err);
		return rc;
	}
	if (m->format && m->format != f->fmt->id)
		return kiln__fail(err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
				  "%s is a %s file, the model's first file %s (a model is of one "
				  "format)",
				  f->path ? kiln__file_shown(f) : "the buffer", f->fmt->name,
				  kiln_format_name(m->format));
	m->format = f->fmt->id;
	rc = f->fmt->read(f, exact, err);
	if (rc) {
		if (kiln_is_format_error(rc))
			name_file(f, err);
		return rc;
	}
	m->count += f->count;
	int lazy = o && (o->flags & KILN_OPEN_DIRECTORY_ONLY);
	/* The directory is read: a cold open quieted the kernel's read-ahead for it (the payload
	 * would have come in behind), which the reads to come need back. */
	if (lazy)
		kiln__file_advise(f, 0, 0, KILN__ADVISE_NORMAL);
	if (lazy && (o->flags & KILN_OPEN_VERIFY_DIGESTS) && (rc = keep_digests(f, err)))
		return rc;
	if (!lazy && (rc = finish_file(f, o, err))) {
		name_file(f, err);
		return rc;
	}
	kiln__index_bind(m, f);
	return 0;
}

/* KILN_OPEN_ALIGN: an owned, 64-byte aligned copy of every tensor whose data is misaligned for
 * its dtype, all in one block, read through each file's source (never the mapping). */
static int realign(struct kiln_model *m, kiln_error *err)
{
	uint64_t total = 0, n = 0;
	for (uint64_t i = 0; i < m->count; i++) {
		const kiln_tensor *t = kiln__view(m, i);
		if (t->data && t->alignment < kiln_dtype_align(t->dtype)) {
			total += kiln__align64(t->byte_length);
			n++;
		}
	}
	if (!n)
		return 0;
	if (total > SIZE_MAX)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "%" PRIu64 " bytes of aligned copies do not fit in memory",
				      total);
	uint8_t *mem = kiln__owned_alloc((size_t)total);
	if (!mem)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "cannot allocate %" PRIu64
				      " bytes for aligned copies of %" PRIu64 " tensors",
				      total, n);
	m->realign_mem = mem;
	m->realign_len = (size_t)total;
	for (uint64_t i = 0, at = 0; i < m->count; i++) {
		kiln_tensor *t = &m->tensors[i];
		if (!t->data || t->alignment >= kiln_dtype_align(t->dtype))
			continue;
		const struct kiln__file *f = &m->files[t->file];
		int rc = kiln__file_read(f, t->file_offset, mem + at, (size_t)t->byte_length, err);
		if (rc) {
			if (err)
				err->tensor = t->index - f->first;
			kiln__error_file(err, t->file);
			return rc;
		}
		t->data = mem + at;
		t->alignment = kiln__align_of((uint64_t)(uintptr_t)t->data);
		at += kiln__align64(t->byte_length);
	}
	m->realigned = (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n);
	return 0;
}

static int finish_model(struct kiln_model *m, const kiln_open_options *o, int rc, kiln_model **out,
			kiln_error *err)
{
	if (!m)
		return rc;
	if (!rc && o && (o->flags & KILN_OPEN_ALIGN))
		rc = realign(m, err);
	if (!rc && o && (o->flags & KILN_OPEN_VERIFY_PAYLOAD))
		rc = kiln_model_verify(m, err);
	if (!rc && o && (o->flags & KILN_OPEN_VERIFY_DIGESTS) &&
	    !(o->flags & KILN_OPEN_DIRECTORY_ONLY))
		m->digests_verified = 1; /* every file's finish checked every byte */
	if (rc) {
		kiln_model_close(m);
		return rc;
	}
	if (o && (o->flags & KILN_OPEN_PACK_VIEWS))
		kiln__index_pack(m); /* nothing writes a view from here on */
	*out = m;
	return 0;
}

/* The model's files: the one embedded for a model of one file, else an array. */
static int alloc_files(struct kiln_model *m, uint32_t n, kiln_error *err)
{
	struct kiln__file *files = &m->one;
	if (n > 1) {
		files = kiln__alloc(&m->alloc, (size_t)n * sizeof(*files));
		if (!files)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					      "cannot allocate the model's %" PRIu32 " files", n);
	}
	for (uint32_t i = 0; i < n; i++)
		kiln__file_init(&files[i], m, &m->alloc, i);
	m->files = files;
	m->nfiles = n;
	return 0;
}

static int check_path_options(const kiln_open_options *opts, kiln_error *err)
{
	int rc = check_options(opts, err);
	if (rc)
		return rc;
	if (opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_OPEN_ALLOW_TRAILING applies to buffers; a file is one block");
	if (opts && opts->buffer && opts->source != KILN_SOURCE_READ &&
	    opts->source != KILN_SOURCE_URING && opts->source != KILN_SOURCE_AUTO)
		return kiln__fail_inval(err, KILN_NO_INDEX, "buffer",
					"a load buffer needs the read or uring source");
	if (opts && opts->source == KILN_SOURCE_BUFFER)
		return kiln__fail_inval(err, KILN_NO_INDEX, "source",
					"source %u cannot open a path (use mmap, read or uring)",
					opts->source);
	return 0;
}

/* Open the model of the files the resolver found (their paths taken over), with `opts`. */
static int open_list(struct kiln__resolved *r, const kiln_open_options *opts,
		     struct kiln_model **out, kiln_error *err)
{
	*out = NULL;
	uint32_t n = r->n;
	if (n > 1 && opts && opts->buffer)
		return kiln__fail_inval(err, KILN_NO_INDEX, "buffer",
					"a load buffer holds one file; the model has %" PRIu32, n);
	struct kiln_model *m = model_new(opts, err);
	if (!m)
		return KILN_NOMEM;
	*out = m;
	int rc = alloc_files(m, n, err);
	for (uint32_t i = 0; !rc && i < n; i++) {
		struct kiln__file *f = &m->files[i];
		f->path = r->files[i].path;
		f->remote = r->files[i].remote;
		f->named_format = r->files[i].named_format;
		r->files[i].path = NULL;
	}
	kiln_open_options o = {0};
	if (opts)
		o = *opts;
	if (r->format)
		o.format = r->format;
	for (uint32_t i = 0; !rc && i < n; i++) {
		rc = open_file(&m->files[i], &o, 0, NULL, 0, 1, err);
		if (rc)
			kiln__error_file(err, i);
	}
	if (!rc && m->nfiles && m->files[0].fmt->done)
		rc = m->files[0].fmt->done(m, err);
	if (rc)
		kiln__resolve_explain(r, rc, err);
	else
		rc = kiln__resolve_check(r, m, err);
	return rc;
}

int kiln_model_open_files(const char *const *paths, uint32_t count, const kiln_open_options *opts,
			  kiln_model **out, kiln_error *err)
{
	kiln_error local; /* without the caller's, the class still comes back */
	if (!err)
		err = &local;
	kiln__clear_error(err);
	if (!out)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "out is NULL");
	*out = NULL;
	if (!paths || count == 0)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "no paths");
	for (uint32_t i = 0; i < count; i++)
		if (!paths[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
						"path %" PRIu32 " is NULL", i);
	int rc = check_path_options(opts, err);
	if (rc)
		return rc;
	struct kiln__resolved r;
	struct kiln_model *m = NULL;
	if (!(rc = kiln__resolve(paths, count, opts, &r, err)))
		rc = open_list(&r, opts, &m, err);
	kiln__resolved_free(&r);
	return finish_model(m, opts, rc, out, err);
}

int kiln_model_open(const char *path, const kiln_open_options *opts, kiln_model **out,
		    kiln_error *err)
{
	kiln__clear_error(err);
	if (!path) {
		if (out)
			*out = NULL;
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	}
	return kiln_model_open_files(&path, 1, opts, out, err);
}

int kiln_model_parse(const void *buf, size_t len, const kiln_open_options *opts, kiln_model **out,
		     kiln_error *err)
{
	kiln_error local; /* without the caller's, the class still comes back */
	if (!err)
		err = &local;
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
	if (opts && (opts->flags & KILN_OPEN_VERIFY_DIGESTS))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_OPEN_VERIFY_DIGESTS checks a file against the digests "
		    "kept beside it; a buffer has no file (check the file with "
		    "kiln_model_verify_digests)");
	struct kiln_model *m = model_new(opts, err);
	if (!m)
		return KILN_NOMEM;
	rc = alloc_files(m, 1, err);
	int exact = !(opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING));
	if (!rc && (rc = open_file(&m->files[0], opts, 1, buf, len, exact, err)))
		kiln__error_file(err, 0);
	return finish_model(m, opts, rc, out, err);
}

int kiln_validate(const void *buf, size_t len, uint32_t flags, kiln_error *err)
{
	kiln_open_options o = {.size = sizeof(o), .flags = flags};
	kiln_model *m;
	int rc = kiln_model_parse(buf, len, &o, &m, err);
	kiln_model_close(m);
	return rc;
}

int kiln__check_directory(const uint8_t *head, uint64_t len, kiln_error *err)
{
	struct kiln_model *m = model_new(NULL, err);
	if (!m)
		return KILN_NOMEM;
	int rc = alloc_files(m, 1, err);
	struct kiln__file *f = &m->files[0];
	/* Only the directory exists: no finish, so base and data pointers stay NULL. */
	if (!rc)
		rc = kiln__file_attach(f, NULL, 1, head, (size_t)len, err);
	if (!rc)
		rc = kiln__format_klnt.read(f, 1, err);
	kiln_model_close(m); /* error offsets are those of the block that would be written */
	return rc;
}

/* --- verification and info ------------------------------------------------------------------ */

int kiln_model_verify(const kiln_model *m, kiln_error *err)
{
	kiln__clear_error(err);
	if (!m)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model is NULL");
	/* A cached result, not a change to the model: threads verifying at once compute the same
	 * answer, and the flag is only ever read and written atomically. */
	int *verified = (int *)&m->verified;
	if (__atomic_load_n(verified, __ATOMIC_ACQUIRE))
		return 0;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		int rc = f->fmt->verify ? f->fmt->verify(f, err) : 0;
		if (rc) {
			name_file(f, err);
			kiln__error_file(err, i);
			return rc;
		}
	}
	__atomic_store_n(verified, 1, __ATOMIC_RELEASE);
	return 0;
}

void kiln_model_get_info(const kiln_model *m, kiln_model_info *info)
{
	if (!info)
		return;
	memset(info, 0, sizeof(*info));
	if (!m)
		return;
	info->format = m->format;
	info->files = m->nfiles;
	info->tensor_count = m->count;
	info->direct = 1;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		const struct kiln__load *l = &f->load;
		info->bytes += f->size;
		if (i == 0) {
			info->source = l->source;
			info->auto_choice = l->auto_choice;
		}
		info->direct &= l->direct;
		if (l->direct_fallback)
			info->direct_fallback = l->direct_fallback;
		if (l->uring_fallback)
			info->uring_fallback = l->uring_fallback;
		if (l->advice_errno)
			info->advice_errno = l->advice_errno;
		if (l->dio_align)
			info->dio_align = l->dio_align;
		if (l->cache_refused)
			info->cache_refused = l->cache_refused;
	}
	if (!m->nfiles)
		info->direct = 0;
	/* Written by kiln_model_verify, which may run concurrently: read it atomically. */
	info->payload_verified = (uint8_t)__atomic_load_n(&m->verified, __ATOMIC_ACQUIRE);
	info->pinned = m->pinned;
	info->realigned = m->realigned;
	info->digest_chunks = atomic_load_explicit(&m->digest_chunks, memory_order_relaxed);
	info->digest_bytes = atomic_load_explicit(&m->digest_bytes, memory_order_relaxed);
	info->digests_verified = (uint8_t)m->digests_verified;
}

int kiln_model_file_info(const kiln_model *m, uint32_t file, kiln_file_info *info)
{
	if (info)
		memset(info, 0, sizeof(*info));
	if (!m || file >= m->nfiles || !info)
		return KILN_INVAL;
	const struct kiln__file *f = &m->files[file];
	info->path = kiln__file_name(f);
	info->format = f->fmt ? f->fmt->id : 0;
	info->version = f->version;
	info->size = f->size;
	info->first_tensor = f->first;
	info->tensor_count = f->count;
	info->payload_base = f->payload_base;
	info->payload_bytes = f->payload_bytes;
	info->alignment = f->alignment;
	info->flags = f->flags;
	info->name_bytes = f->name_bytes;
	info->directory_bytes = f->directory_bytes;
	info->base = f->base;
	info->source = f->load.source;
	info->auto_choice = f->load.auto_choice;
	/* A table (a key of another type is no table: said when digests are asked for). */
	if (f->embedded.enc == KILN__EMBED_RAW || f->embedded.enc == KILN__EMBED_BASE64) {
		info->digests_offset = f->embedded.at;
		info->digests_bytes = f->embedded.len;
	}
	return 0;
}

int kiln_model_has_file(const kiln_model *m, const char *path)
{
	struct stat st;
	if (!m || !path || stat(path, &st) != 0)
		return 0;
	for (uint32_t i = 0; i < m->nfiles; i++)
		if (kiln__file_is(&m->files[i], &st))
			return 1;
	return 0;
}

uint32_t kiln_model_files(const kiln_model *m)
{
	return m ? m->nfiles : 0;
}
