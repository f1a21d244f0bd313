/* SPDX-License-Identifier: MIT */
/*
 * The lifecycle of a model, on top of everything else in src/: options, open (paths through a
 * source, one file after another), parse (a caller's buffer), payload verification, info, close.
 *
 * Opening a file: its source attaches it; its first bytes say its format (or the caller did);
 * the format's reader validates the header and directory through the source (src/format.h) and
 * adds its tensors to the model's one index; the source finishes (maps, reads the payload); the
 * views are bound to the file's memory. A model of several files is the same, file by file,
 * into one index and one name table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"
#include "io/engine.h"
#include "index/meta.h"
#include "format/safetensors.h"
#include "net/net.h"
#include "model/series.h"
#include "source/source.h"
#include "base/sys.h"

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
			       KILN_OPEN_DIRECT | KILN_OPEN_PRIVATE | KILN_OPEN_ONE_FILE |
			       KILN_OPEN_ALIGN | KILN_OPEN_DIRECTORY_ONLY;
	if (opts->flags & ~known)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown open flags 0x%x",
					opts->flags & ~known);
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
	if (opts->format > KILN_FORMAT_SAFETENSORS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "format", "unknown format %u",
					opts->format);
	for (size_t i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
						"kiln_open_options.reserved[%zu] is not 0", i);
	int rc = kiln__remote_check_options(opts->remote, err);
	if (rc)
		return rc;
	const kiln_allocator *a = opts->allocator;
	if (a && (!a->alloc || !a->free))
		return kiln__fail_inval(err, KILN_NO_INDEX, "allocator",
					"an allocator needs both alloc and free");
	return 0;
}

struct kiln_model *kiln__model_new(const kiln_open_options *opts, kiln_error *err)
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
	return m;
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

void kiln__expect(struct kiln__file *f, uint64_t off, uint64_t end)
{
	if (f->src->expect)
		f->src->expect(f, off, end);
}

void *kiln__keep_alloc(struct kiln__file *f, size_t len, kiln_error *err)
{
	size_t head = sizeof(struct kiln__kept);
	if (len > SIZE_MAX - head) {
		kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate %zu bytes", len);
		return NULL;
	}
	struct kiln__kept *k = kiln__alloc(&f->model->alloc, head + len);
	if (!k) {
		kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
			       "cannot allocate %zu bytes for the directory", len);
		return NULL;
	}
	k->len = head + len;
	k->next = f->kept;
	f->kept = k;
	return (uint8_t *)k + head;
}

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

/* --- close ----------------------------------------------------------------------------------- */

static void file_release(struct kiln__file *f)
{
	if (f->src)
		f->src->release(f);
	while (f->kept) {
		struct kiln__kept *k = f->kept;
		f->kept = k->next;
		kiln__free(&f->model->alloc, k, k->len);
	}
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	free(f->path);
	f->path = NULL;
	free(f->url);
	f->url = NULL;
}

void kiln_model_close(kiln_model *m)
{
	if (!m)
		return;
	/* Registrations first: no pin hook may outlive the memory it registered. */
	kiln__pins_release(m);
	kiln__index_free(m);
	for (uint32_t i = 0; m->files && i < m->nfiles; i++)
		file_release(&m->files[i]);
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

static const struct kiln__format *const formats[] = {
    [KILN_FORMAT_KLNT] = &kiln__format_klnt,
    [KILN_FORMAT_GGUF] = &kiln__format_gguf,
    [KILN_FORMAT_SAFETENSORS] = &kiln__format_safetensors,
};

const struct kiln__format *kiln__format_by_id(unsigned id)
{
	return id < sizeof(formats) / sizeof(formats[0]) ? formats[id] : NULL;
}

const struct kiln__format *kiln__format_sniff(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		if (formats[i] && formats[i]->sniff(p, len))
			return formats[i];
	return NULL;
}

const char *kiln_format_name(unsigned format)
{
	static const char *const names[] = {"auto", "klnt", "gguf", "safetensors"};
	return format < sizeof(names) / sizeof(names[0]) ? names[format] : NULL;
}

/* The source for a path: REMOTE for a URL; else from the options, the table the caller named;
 * AUTO is the mapping, which then decides per file (src/source_map.c), unless owned bytes were
 * asked for in so many words (a load buffer, O_DIRECT): io_uring, the faster owned load. */
const struct kiln__source *kiln__source_for(const char *path, const kiln_open_options *o)
{
	if (kiln__is_url(path))
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

/* The reader for file f: the format the caller named, the one its first bytes say, or the one
 * its name ends in; any other file is refused (FRAME, naming the magic it has). */
static int format_of(struct kiln__file *f, const kiln_open_options *o,
		     const struct kiln__format **out, kiln_error *err)
{
	unsigned want = o ? o->format : KILN_FORMAT_AUTO;
	uint64_t n = f->size < KILN__HEADER_SIZE ? f->size : KILN__HEADER_SIZE;
	const uint8_t *p = NULL;
	int rc = n ? kiln__fetch(f, 0, n, 0, &p, err) : 0;
	if (rc)
		return rc;
	const struct kiln__format *fmt = n ? kiln__format_sniff(p, (size_t)n) : NULL;
	if (want) {
		/* Insisting on a format: a file that is plainly another is refused as what it
		 * is; one like none goes to the wanted reader, which says what is wrong. */
		const struct kiln__format *w = kiln__format_by_id(want);
		if (fmt && fmt != w)
			return kiln__fail(err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
					  "a %s file, not %s (the format asked for)", fmt->name,
					  w->name);
		*out = w;
		return 0;
	}
	/* Bytes that start like no format, in a file named for one: that format's reader names the
	 * defect in its own terms. */
	static const struct {
		const char *ext;
		const struct kiln__format *fmt;
	} named[] = {{".safetensors", &kiln__format_safetensors},
		     {".gguf", &kiln__format_gguf},
		     {".klnt", &kiln__format_klnt}};
	const char *name = f->path ? kiln__file_name(f) : NULL;
	size_t plen = name ? kiln__url_path_len(name) : 0;
	for (size_t i = 0; !fmt && i < sizeof(named) / sizeof(named[0]); i++) {
		size_t e = strlen(named[i].ext);
		if (plen > e && !memcmp(name + plen - e, named[i].ext, e))
			fmt = named[i].fmt;
	}
	/* Bytes that start like no format at all: the KLNT reader's verdict on its magic, whatever
	 * the length (a short text file is not a truncated KLNT file). */
	if (!fmt && n >= 4)
		return kiln__fail(
		    err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
		    "magic is %02x %02x %02x %02x, not \"KLNT\"; not a safetensors or "
		    "GGUF file either",
		    p[0], p[1], p[2], p[3]);
	*out = fmt ? fmt : &kiln__format_klnt;
	return 0;
}

/* Name the file in an error from a model of several files: the reader's message names none. */
static void name_file(const struct kiln__file *f, kiln_error *err)
{
	if (f->path && f->model->nfiles > 1)
		kiln__error_prefix(err, kiln__file_name(f));
}

/* Attach, read and finish file f (its path set, or the buffer for BUFFER). */
static int open_file(struct kiln__file *f, const kiln_open_options *o, const void *buf, size_t len,
		     int exact, kiln_error *err)
{
	struct kiln_model *m = f->model;
	int rc = f->src->attach(f, o, buf, len, err);
	if (rc) {
		if (rc == KILN_IO && err && err->sys_errno == ENOENT && m->nfiles > 1)
			snprintf(err->message, sizeof(err->message),
				 "%s: shard %" PRIu32 " of %" PRIu32 " is missing",
				 kiln__file_name(f), f->no + 1, m->nfiles);
		return rc;
	}
	f->first = m->count;
	if ((rc = format_of(f, o, &f->fmt, err))) {
		if (kiln_is_format_error(rc))
			name_file(f, err);
		return rc;
	}
	if (m->format && m->format != f->fmt->id)
		return kiln__fail(err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
				  "%s is a %s file, the model's first file %s (a model is of one "
				  "format)",
				  f->path ? kiln__file_name(f) : "the buffer", f->fmt->name,
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
	if (!lazy && f->src->finish && (rc = f->src->finish(f, o, err))) {
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
		const kiln_tensor *t = &m->tensors[i];
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
		int rc = f->src->read(f, t->file_offset, mem + at, (size_t)t->byte_length, err);
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
	if (rc) {
		kiln_model_close(m);
		return rc;
	}
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
	memset(files, 0, (size_t)n * sizeof(*files));
	for (uint32_t i = 0; i < n; i++) {
		files[i].model = m;
		files[i].no = i;
		files[i].fd = -1;
	}
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

/* Open the model of the files `list` (resolved: n paths, taken over), with `opts`; the format
 * forced to `format` when not 0. */
static int open_list(char **list, uint32_t n, const kiln_open_options *opts, unsigned format,
		     struct kiln_model **out, kiln_error *err)
{
	*out = NULL;
	if (n > 1 && opts && opts->buffer) {
		kiln__paths_free(list, n);
		return kiln__fail_inval(err, KILN_NO_INDEX, "buffer",
					"a load buffer holds one file; the model has %" PRIu32, n);
	}
	struct kiln_model *m = kiln__model_new(opts, err);
	if (!m) {
		kiln__paths_free(list, n);
		return KILN_NOMEM;
	}
	int rc = alloc_files(m, n, err);
	for (uint32_t i = 0; i < n; i++) {
		if (!rc) {
			m->files[i].path = list[i];
			m->files[i].src = kiln__source_for(list[i], opts);
		} else {
			free(list[i]);
		}
	}
	free(list);
	kiln_open_options o = {0};
	if (opts)
		o = *opts;
	if (format)
		o.format = format;
	for (uint32_t i = 0; !rc && i < n; i++) {
		rc = open_file(&m->files[i], &o, NULL, 0, 1, err);
		if (rc)
			kiln__error_file(err, i);
	}
	if (!rc && m->nfiles && m->files[0].fmt->done)
		rc = m->files[0].fmt->done(m, err);
	*out = m;
	return rc;
}

/* A whole small file (an index) into new memory, at most `cap` bytes. */
static int read_small(const char *path, const kiln_open_options *o, size_t cap, char **out,
		      size_t *len, kiln_error *err)
{
	if (kiln__is_url(path))
		return kiln__remote_read_small(path, o ? o->remote : NULL, cap, out, len, err);
	uint64_t size;
	int fd = kiln__open_file(path, &size, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	int rc = 0;
	char *buf = NULL;
	if (size > cap)
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "length", KILN_NO_OFFSET,
				"%s: %" PRIu64 " bytes, above the %zu-byte cap of an index", path,
				size, cap);
	else if (!(buf = malloc((size_t)size + 1)))
		rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
	else if ((rc = kiln__pread_full(fd, buf, (size_t)size, 0, err)))
		kiln__error_prefix(err, path);
	close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[size] = '\0';
	*out = buf;
	*len = (size_t)size;
	return 0;
}

#define INDEX_CAP ((size_t)100000000) /* as a safetensors header */

/* A model.safetensors.index.json: the shards its weight_map names, beside it, as one model, each
 * tensor in the shard the index says. */
static int open_index(const char *path, const kiln_open_options *opts, struct kiln_model **out,
		      kiln_error *err)
{
	char *text = NULL;
	size_t len = 0;
	struct kiln__st_index ix;
	int rc = read_small(path, opts, INDEX_CAP, &text, &len, err);
	if (rc || (rc = kiln__st_index_parse(text, len, path, &ix, err)))
		return rc;
	/* The shards beside it: in its directory, or under its URL's last slash (before a query).
	 */
	const char *slash = memrchr(path, '/', kiln__url_path_len(path));
	size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
	char **list = calloc(ix.nshards, sizeof(*list));
	for (uint32_t i = 0; list && i < ix.nshards; i++) {
		size_t n = strlen(ix.shards[i]);
		if (!(list[i] = malloc(dlen + n + 1)))
			break;
		memcpy(list[i], path, dlen);
		memcpy(list[i] + dlen, ix.shards[i], n + 1);
	}
	if (!list || !list[ix.nshards - 1]) {
		kiln__paths_free(list, ix.nshards);
		kiln__st_index_free(&ix);
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
	}
	struct kiln_model *m;
	rc = open_list(list, ix.nshards, opts, KILN_FORMAT_SAFETENSORS, &m, err);
	if (rc == KILN_IO && err && err->file != KILN_NO_FILE && err->sys_errno == ENOENT) {
		const char *shard = ix.shards[err->file];
		snprintf(err->message, sizeof(err->message),
			 "%s: shard %s, which its weight_map names, is missing", path, shard);
	}
	if (!rc)
		rc = kiln__st_index_check(m, &ix, path, err);
	kiln__st_index_free(&ix);
	return finish_model(m, opts, rc, out, err);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
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
	unsigned want = opts ? opts->format : KILN_FORMAT_AUTO;
	for (uint32_t i = 0; i < count; i++)
		if (ends_with(paths[i], ".json") &&
		    (want == KILN_FORMAT_AUTO || want == KILN_FORMAT_SAFETENSORS)) {
			if (count != 1)
				return kiln__fail_inval(
				    err, KILN_NO_INDEX, "path",
				    "%s: an index is the only path of its model", paths[i]);
			return open_index(paths[0], opts, out, err);
		}
	char **list;
	uint32_t n;
	int one = opts && (opts->flags & KILN_OPEN_ONE_FILE);
	if ((rc = kiln__series_resolve(paths, count, one, &list, &n, err)))
		return rc;
	struct kiln_model *m;
	rc = open_list(list, n, opts, 0, &m, err);
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
	struct kiln_model *m = kiln__model_new(opts, err);
	if (!m)
		return KILN_NOMEM;
	rc = alloc_files(m, 1, err);
	m->files[0].src = &kiln__source_buffer;
	int exact = !(opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING));
	if (!rc && (rc = open_file(&m->files[0], opts, buf, len, exact, err)))
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
	struct kiln_model *m = kiln__model_new(NULL, err);
	if (!m)
		return KILN_NOMEM;
	int rc = alloc_files(m, 1, err);
	struct kiln__file *f = &m->files[0];
	f->src = &kiln__source_buffer;
	/* Only the directory exists: no finish, so base and data pointers stay NULL. */
	if (!rc)
		rc = f->src->attach(f, NULL, head, (size_t)len, err);
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
	}
	if (!m->nfiles)
		info->direct = 0;
	/* Written by kiln_model_verify, which may run concurrently: read it atomically. */
	info->payload_verified = (uint8_t)__atomic_load_n(&m->verified, __ATOMIC_ACQUIRE);
	info->pinned = m->pinned;
	info->realigned = m->realigned;
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
	return 0;
}

int kiln_model_has_file(const kiln_model *m, const char *path)
{
	struct stat a, b;
	if (!m || !path || stat(path, &a) != 0)
		return 0;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		/* The open descriptor where there is one: the file itself, whatever its name now.
		 */
		int same = f->fd >= 0 ? !fstat(f->fd, &b) : f->path && !stat(f->path, &b);
		if (same && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return 1;
	}
	return 0;
}

uint32_t kiln_model_files(const kiln_model *m)
{
	return m ? m->nfiles : 0;
}
