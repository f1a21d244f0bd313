/* SPDX-License-Identifier: MIT */
/*
 * Loading: every source (mmap, read, uring, with and without O_DIRECT) yields the same bytes;
 * owned copies survive a truncated file; streaming into destinations and staging rings; hints;
 * pinning; and the failure paths through an injected system-call layer (src/base/sys.h): short
 * reads, EINTR/EAGAIN, EIO on the third request, O_DIRECT refused, io_uring unavailable, mlock
 * refused.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"

#define NT 6
static uint8_t *data[NT];
static kiln_tensor_spec spec[NT];
static char *path;

/* Sizes chosen to straddle pages, chunks and O_DIRECT blocks: an empty tensor, odd lengths, and
 * one of several MiB so a 64 KiB chunk size makes dozens of requests. */
static const uint64_t sizes[NT] = {3, 0, 4097, 65536 + 100, 3u << 20, 777};

static void make_file(void)
{
	uint64_t x = 42;
	for (int i = 0; i < NT; i++) {
		data[i] = malloc(sizes[i] ? sizes[i] : 1);
		fill_random(data[i], sizes[i], &x);
		static char names[NT][8];
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		spec[i] = (kiln_tensor_spec){.name = names[i],
					     .name_len = strlen(names[i]),
					     .dtype = KILN_DT_U8,
					     .rank = 1,
					     .shape = {sizes[i]},
					     .data = data[i]};
	}
	char *dir = temp_dir();
	cr_assert(asprintf(&path, "%s/load.klnt", dir) > 0);
	free(dir);
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, spec, NT, KILN_WRITE_NO_DIGESTS, &err), 0, "%s",
		     err.message);
}

static void drop_file(void)
{
	kiln__sys = kiln__sys_default;
	unlink(path);
	free(path);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

TestSuite(load, .init = make_file, .fini = drop_file);
TestSuite(faults, .init = make_file, .fini = drop_file);

static kiln_model *open_with(unsigned source, uint32_t flags, uint32_t chunk, uint32_t qd)
{
	kiln_open_options o = {
	    .source = source, .flags = flags, .chunk_size = chunk, .queue_depth = qd};
	kiln_model *dir;
	kiln_error err;
	int rc = kiln_model_open(path, &o, &dir, &err);
	cr_assert_eq(rc, 0, "%s: %s: %s", kiln_source_name(source), kiln_code_name(rc),
		     err.message);
	return dir;
}

static void expect_same_bytes(kiln_model *dir, const char *what)
{
	cr_assert_eq(kiln_model_count(dir), NT);
	for (uint32_t i = 0; i < NT; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		cr_assert_eq(t->byte_length, sizes[i]);
		cr_assert_eq((uintptr_t)t->data % 64, 0, "%s: tensor %u not 64-byte aligned", what,
			     i);
		cr_assert_geq(t->alignment, 64, "%s: tensor %u says alignment %u", what, i,
			      t->alignment);
		cr_assert_eq(t->file, 0);
		cr_assert_eq(memcmp(t->data, data[i], sizes[i]), 0, "%s: tensor %u differs", what,
			     i);
	}
	kiln_error err;
	cr_assert_eq(kiln_model_verify(dir, &err), 0, "%s: %s", what, err.message);
}

Test(load, every_source_gives_the_same_bytes)
{
	static const struct {
		unsigned source;
		uint32_t flags;
		const char *name;
	} modes[] = {
	    {KILN_SOURCE_MMAP, 0, "mmap"},
	    {KILN_SOURCE_MMAP, KILN_OPEN_POPULATE, "mmap+populate"},
	    {KILN_SOURCE_READ, 0, "read"},
	    {KILN_SOURCE_URING, 0, "uring"},
	    {KILN_SOURCE_READ, KILN_OPEN_DIRECT, "read+direct"},
	    {KILN_SOURCE_URING, KILN_OPEN_DIRECT, "uring+direct"},
	};
	const uint32_t chunks[] = {0, 65536, 1000};
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		for (size_t c = 0; c < 3; c++) {
			kiln_model *dir = open_with(modes[m].source, modes[m].flags, chunks[c], 4);
			kiln_model_info info;
			kiln_model_get_info(dir, &info);
			kiln_file_info fi;
			cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
			cr_assert_eq(info.source, modes[m].source);
			cr_assert_eq(fi.source, modes[m].source);
			if (modes[m].source != KILN_SOURCE_MMAP)
				cr_assert_eq((uintptr_t)fi.base % 4096, 0,
					     "owned memory is page aligned");
			if (modes[m].flags & KILN_OPEN_DIRECT) {
				/* ext4 (the build tree) supports O_DIRECT: it must really be used.
				 */
				cr_assert_eq(info.direct, 1, "%s: fell back (%d)", modes[m].name,
					     info.direct_fallback);
				cr_assert_gt(info.dio_align, 0);
			}
			expect_same_bytes(dir, modes[m].name);
			kiln_model_close(dir);
		}
	}
}

Test(load, golden_cases_through_every_source)
{
	const char *cases[] = {"kiln-v2-empty",   "kiln-v2-f32",    "kiln-v2-f16-named",
			       "kiln-v2-f8-pair", "kiln-v2-scales", "kiln-v2-scales-outer",
			       "kiln-v2-opaque"};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		blob b = load_golden(cases[c]);
		char *p = write_temp(b.p, b.len);
		for (unsigned src = 0; src <= 3; src++) {
			if (src == KILN_SOURCE_BUFFER)
				continue;
			for (int direct = 0; direct < 2; direct++) {
				kiln_open_options o = {.source = src,
						       .flags =
							   KILN_OPEN_VERIFY_PAYLOAD |
							   (direct && src ? KILN_OPEN_DIRECT : 0)};
				kiln_model *dir;
				kiln_error err;
				cr_assert_eq(kiln_model_open(p, &o, &dir, &err), 0, "%s %s: %s",
					     cases[c], kiln_source_name(src), err.message);
				kiln_file_info info;
				cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
				cr_assert_eq(memcmp(info.base, b.p, b.len), 0, "%s via %s",
					     cases[c], kiln_source_name(src));
				kiln_model_close(dir);
			}
		}
		unlink(p);
		free(p);
		blob_free(&b);
	}
}

Test(load, into_a_reused_caller_buffer)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	/* aligned_alloc needs a multiple of the alignment (ASan enforces it) */
	size_t cap = ((size_t)st.st_size + 8192 + 4095) & ~(size_t)4095;
	uint8_t *buf = aligned_alloc(4096, cap);
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		for (int round = 0; round < 2; round++) { /* the same memory, twice */
			memset(buf, 0xEE, cap);
			kiln_open_options o = {.source = src,
					       .buffer = buf,
					       .buffer_size = cap,
					       .flags = round ? KILN_OPEN_DIRECT : 0};
			kiln_model *dir;
			kiln_error err;
			cr_assert_eq(kiln_model_open(path, &o, &dir, &err), 0, "%s", err.message);
			kiln_file_info info;
			cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
			cr_assert_eq(info.base, buf);
			expect_same_bytes(dir, "caller buffer");
			kiln_model_close(dir); /* must not free buf */
		}
	}
	kiln_open_options o = {.source = KILN_SOURCE_READ, .buffer = buf + 8, .buffer_size = cap};
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_INVAL, "not 64-byte aligned");
	o = (kiln_open_options){
	    .source = KILN_SOURCE_URING, .buffer = buf, .buffer_size = (size_t)st.st_size - 1};
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_INVAL, "too small");
	cr_assert_str_eq(err.field, "buffer");
	o = (kiln_open_options){.buffer = buf, .buffer_size = cap};
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_INVAL, "mmap has no load buffer");
	free(buf);
}

Test(load, rejected_file_reads_no_payload)
{
	/* A bad directory is refused before the block is allocated or the payload read. */
	blob b = load_golden("kiln-v2-opaque-no-layout");
	char *p = write_temp(b.p, b.len);
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		kiln_open_options o = {.source = src};
		kiln_model *dir;
		kiln_error err;
		cr_assert_eq(kiln_model_open(p, &o, &dir, &err), KILN_TYPE);
		cr_assert_null(dir);
	}
	unlink(p);
	free(p);
	blob_free(&b);
}

/* --- owned copies ---------------------------------------------------------------------------- */

Test(load, copies_from_every_source)
{
	for (unsigned src = 0; src <= 3; src++) {
		if (src == KILN_SOURCE_BUFFER)
			continue;
		kiln_model *dir = open_with(src, 0, 0, 0);
		for (uint32_t i = 0; i < NT; i++) {
			uint8_t *buf = malloc(sizes[i] + 1);
			kiln_error err;
			cr_assert_eq(kiln_tensor_copy(dir, i, buf, sizes[i], &err), 0, "%s",
				     err.message);
			cr_assert_eq(memcmp(buf, data[i], sizes[i]), 0);
			if (sizes[i])
				cr_assert_eq(kiln_tensor_copy(dir, i, buf, sizes[i] - 1, &err),
					     KILN_INVAL);
			free(buf);
			void *d;
			cr_assert_eq(kiln_tensor_dup(dir, i, 4096, &d, &err), 0, "%s", err.message);
			cr_assert_eq((uintptr_t)d % 4096, 0);
			cr_assert_eq(memcmp(d, data[i], sizes[i]), 0);
			kiln_free(d);
		}
		void *d;
		kiln_error err;
		cr_assert_eq(kiln_tensor_dup(dir, 0, 100, &d, &err), KILN_INVAL);
		cr_assert_eq(kiln_tensor_dup(dir, 0, 32, &d, &err), KILN_INVAL);
		cr_assert_eq(kiln_tensor_dup(dir, NT, 64, &d, &err), KILN_INVAL);
		kiln_model_close(dir);
	}
}

/* The permissions ("r--s", "rw-p", ...) of the mapping holding `p`, from /proc/self/maps. */
static const char *map_perms(const void *p)
{
	static char perms[8];
	FILE *f = fopen("/proc/self/maps", "r");
	cr_assert_not_null(f);
	unsigned long lo, hi;
	perms[0] = '\0';
	while (fscanf(f, "%lx-%lx %4s%*[^\n]", &lo, &hi, perms) == 3)
		if ((uintptr_t)p >= lo && (uintptr_t)p < hi)
			break;
		else
			perms[0] = '\0';
	fclose(f);
	return perms;
}

/* KILN_OPEN_PRIVATE: writes through a data pointer (what a PyTorch tensor made with DLPack may
 * do) land in the process's private copy; the file, a second directory and the readers that go
 * to the file (copy) keep the file's bytes. */
Test(load, private_mapping_takes_writes_without_changing_the_file)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, KILN_OPEN_PRIVATE, 0, 0);
	kiln_model *other = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	const kiln_tensor *t = kiln_model_tensor(dir, 4); /* several MiB: many pages */
	uint8_t *w = (uint8_t *)t->data;
	for (uint64_t k = 0; k < t->byte_length; k += 1000)
		w[k] = (uint8_t)~data[4][k];
	for (uint64_t k = 0; k < t->byte_length; k += 1000)
		cr_assert_eq(w[k], (uint8_t)~data[4][k], "the write is visible to the writer");
	cr_assert_eq(memcmp(kiln_model_tensor(other, 4)->data, data[4], sizes[4]), 0,
		     "another directory of the same file sees the file's bytes");
	uint8_t *buf = malloc(sizes[4]);
	kiln_error err;
	cr_assert_eq(kiln_tensor_copy(dir, 4, buf, sizes[4], &err), 0, "%s", err.message);
	cr_assert_eq(memcmp(buf, data[4], sizes[4]), 0, "copy reads the file");
	int fd = open(path, O_RDONLY);
	cr_assert(fd >= 0);
	cr_assert_eq(pread(fd, buf, sizes[4], (off_t)t->file_offset), (ssize_t)sizes[4]);
	cr_assert_eq(memcmp(buf, data[4], sizes[4]), 0, "the file is unchanged");
	close(fd);
	cr_assert_eq(kiln_model_verify(dir, &err), 0, "%s", err.message);
	kiln_model_close(dir);
	/* Reopened privately: the writes died with the mapping. */
	dir = open_with(KILN_SOURCE_MMAP, KILN_OPEN_PRIVATE, 0, 0);
	expect_same_bytes(dir, "mmap+private");
	kiln_model_close(dir);
	free(buf);

	/* The mappings as the kernel has them: copy-on-write private, and read-only shared
	 * without the flag (where the same write is SIGSEGV). */
	cr_assert_str_eq(map_perms(kiln_model_tensor(other, 4)->data), "r--s");
	dir = open_with(KILN_SOURCE_MMAP, KILN_OPEN_PRIVATE, 0, 0);
	cr_assert_str_eq(map_perms(kiln_model_tensor(dir, 4)->data), "rw-p");
	kiln_model_close(dir);
	kiln_model_close(other);
}

/* READ/URING memory is private already: the flag is accepted and writes stay in the block. */
Test(load, private_flag_with_owned_memory)
{
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		kiln_model *dir = open_with(src, KILN_OPEN_PRIVATE, 0, 0);
		expect_same_bytes(dir, kiln_source_name(src));
		uint8_t *w = (uint8_t *)kiln_model_tensor(dir, 2)->data;
		w[0] = (uint8_t)~data[2][0];
		cr_assert_eq(w[0], (uint8_t)~data[2][0]);
		kiln_model_close(dir);
	}
}

/* Where the flag cannot be kept it is refused, naming the field. */
Test(load, private_flag_refusals)
{
	kiln_open_options o = {.flags = KILN_OPEN_PRIVATE | KILN_OPEN_LOCK};
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "flags");
	cr_assert(strstr(err.message, "copy every page"), "%s", err.message);
	cr_assert_null(dir);

	static _Alignas(64) uint8_t buf[4096];
	kiln_tensor_spec one = {.dtype = KILN_DT_U8, .rank = 1, .shape = {3}, .data = data[0]};
	blob b = build(&one, 1);
	cr_assert(b.len <= sizeof(buf));
	memcpy(buf, b.p, b.len);
	o.flags = KILN_OPEN_PRIVATE;
	cr_assert_eq(kiln_model_parse(buf, b.len, &o, &dir, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "flags");
	cr_assert(strstr(err.message, "mapped files"), "%s", err.message);
	cr_assert_null(dir);
	o.flags = 0;
	cr_assert_eq(kiln_model_parse(buf, b.len, &o, &dir, &err), 0, "%s", err.message);
	kiln_model_close(dir);
	blob_free(&b);
}

/* The error for a file truncated after open names the file and where it ends now (not where
 * the read that found out began), in the message and in err.offset, for a copy and for the
 * engine's reads alike. */
Test(load, a_truncated_file_is_named_with_where_it_ends)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(m, 0, &info), 0);
	uint64_t end = info.payload_base + 10;
	cr_assert_eq(truncate(path, (off_t)end), 0);
	const kiln_tensor *big = kiln_model_find_cstr(m, "t4");
	uint8_t *buf = malloc(big->byte_length);
	char where[64];
	snprintf(where, sizeof(where), "ended at byte %llu", (unsigned long long)end);
	kiln_error err;
	for (int how = 0; how < 2; how++) {
		int rc =
		    how ? kiln_tensor_read(m, big->index, buf, big->byte_length, NULL, NULL, &err)
			: kiln_tensor_copy(m, big->index, buf, big->byte_length, &err);
		cr_assert_eq(rc, KILN_IO);
		cr_assert_eq(err.file, 0);
		cr_assert_eq(err.offset, end, "%s", err.message);
		cr_assert_not_null(strstr(err.message, path), "%s", err.message);
		cr_assert_not_null(strstr(err.message, where), "%s", err.message);
	}
	free(buf);
	kiln_model_close(m);
}

Test(load, copy_after_truncation_is_an_error_not_a_crash)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
	/* Someone truncates the file under the mapping. */
	cr_assert_eq(truncate(path, (off_t)info.payload_base), 0);
	const kiln_tensor *big = kiln_model_find_cstr(dir, "t4");
	uint8_t *buf = malloc(big->byte_length);
	kiln_error err;
	cr_assert_eq(kiln_tensor_copy(dir, big->index, buf, big->byte_length, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_eq(err.tensor, big->index);
	cr_assert_eq(err.file, 0);
	cr_assert_not_null(strstr(err.message, "ended"), "%s", err.message);
	void *d = (void *)1;
	cr_assert_eq(kiln_tensor_dup(dir, big->index, 64, &d, &err), KILN_IO);
	cr_assert_null(d);
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, NULL, NULL, &err), KILN_IO);
	for (int i = 0; i < NT; i++)
		free(dests[i]);
	free(buf);
	kiln_model_close(dir);
}

/* --- streaming ------------------------------------------------------------------------------- */

struct landing {
	uint64_t seen[NT]; /* bytes seen per tensor */
	uint64_t chunks;
	uint8_t *device[NT]; /* staging mode: the "device" copy */
	uint32_t reuse_calls;
	uint64_t cancel_after;
	int bad;
};

static int on_chunk(void *ctx, const kiln_chunk *c)
{
	struct landing *l = ctx;
	if (c->tensor >= NT || c->file != 0 || c->offset + c->length > sizes[c->tensor])
		l->bad = 1;
	else if (l->device[c->tensor])
		memcpy(l->device[c->tensor] + c->offset, c->data, c->length);
	else if (memcmp(c->data, data[c->tensor] + c->offset, c->length) != 0)
		l->bad = 1; /* direct mode: the bytes must already be in place */
	l->seen[c->tensor < NT ? c->tensor : 0] += c->length;
	l->chunks++;
	return l->cancel_after && l->chunks >= l->cancel_after;
}

static int before_reuse(void *ctx, uint32_t buffer)
{
	(void)buffer;
	((struct landing *)ctx)->reuse_calls++;
	return 0;
}

/* What AUTO picks for a file whose pages are all cached: pread where the kernel has cachestat(2)
 * to say so, else io_uring. */
static uint32_t auto_engine_when_cached(void)
{
	int fd = open(path, O_RDONLY);
	struct {
		uint64_t off, len;
	} range = {0, 0};
	uint64_t stat[5];
	long rc = syscall(451 /* cachestat */, fd, &range, stat, 0);
	close(fd);
	return rc == 0 ? KILN_ENGINE_PREAD : KILN_ENGINE_URING;
}

Test(load, stream_into_destinations)
{
	for (unsigned src = 0; src <= 3; src++) {
		if (src == KILN_SOURCE_BUFFER)
			continue;
		for (unsigned engine = KILN_ENGINE_AUTO; engine <= KILN_ENGINE_PREAD; engine++) {
			for (int direct = 0; direct < 2; direct++) {
				kiln_model *dir = open_with(src, 0, 0, 0);
				void *dests[NT];
				uint8_t *raw[NT];
				for (int i = 0; i < NT; i++) {
					raw[i] = malloc(sizes[i] + 2);
					dests[i] = raw[i] + 1; /* deliberately unaligned */
				}
				struct landing l = {0};
				kiln_stream_options o = {.engine = engine,
							 .chunk_size = 65536,
							 .queue_depth = 8,
							 .on_chunk = on_chunk,
							 .ctx = &l,
							 .flags = direct ? KILN_STREAM_DIRECT : 0};
				kiln_stream_result res;
				kiln_error err;
				cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &o, &res, &err), 0,
					     "%s", err.message);
				cr_assert_eq(l.bad, 0);
				for (int i = 0; i < NT; i++) {
					cr_assert_eq(l.seen[i], sizes[i]);
					cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
					free(raw[i]);
				}
				cr_assert_eq(res.chunks, l.chunks);
				cr_assert_gt(res.chunks, 48, "3 MiB in 64 KiB chunks");
				/* READ and URING hold the block: those streams are copies from
				 * memory, reported as PREAD, never direct. */
				int from_memory = src != KILN_SOURCE_MMAP;
				uint32_t want = engine == KILN_ENGINE_PREAD || from_memory
						    ? KILN_ENGINE_PREAD
						: engine == KILN_ENGINE_URING || direct
						    ? KILN_ENGINE_URING
						    : auto_engine_when_cached();
				cr_assert_eq(res.engine, want, "%s, engine %u, direct %d",
					     kiln_source_name(src), engine, direct);
				cr_assert_eq(res.direct, (uint32_t)(direct && !from_memory));
				kiln_model_close(dir);
			}
		}
	}
}

Test(load, stream_a_subset_through_a_staging_ring)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	enum { NB = 3, BS = 256 * 1024 };
	void *ring[NB];
	for (int i = 0; i < NB; i++)
		ring[i] = aligned_alloc(4096, BS); /* as pinned host memory would be */
	for (int direct = 0; direct < 2; direct++) {
		struct landing l = {0};
		const uint64_t pick[] = {4, 2, 0};
		for (int k = 0; k < 3; k++)
			l.device[pick[k]] = calloc(1, sizes[pick[k]] + 1);
		kiln_stream_options o = {.staging = ring,
					 .staging_count = NB,
					 .staging_size = BS,
					 .on_chunk = on_chunk,
					 .before_reuse = before_reuse,
					 .ctx = &l,
					 .flags = direct ? KILN_STREAM_DIRECT : 0};
		kiln_stream_result res;
		kiln_error err;
		cr_assert_eq(kiln_stream(dir, pick, 3, NULL, &o, &res, &err), 0, "%s", err.message);
		for (int k = 0; k < 3; k++) {
			uint64_t i = pick[k];
			cr_assert_eq(memcmp(l.device[i], data[i], sizes[i]), 0, "tensor %u",
				     (unsigned)i);
			free(l.device[i]);
		}
		cr_assert_eq(l.seen[1], 0);
		cr_assert_eq(l.seen[3], 0);
		/* 3 MiB through 256 KiB buffers: 12+ chunks, so buffers were reused. */
		cr_assert_geq(l.reuse_calls, res.chunks - NB);
		cr_assert_eq(res.direct, (uint32_t)direct);
	}
	for (int i = 0; i < NB; i++)
		free(ring[i]);
	kiln_model_close(dir);
}

Test(load, stream_cancel_stops_cleanly)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	struct landing l = {.cancel_after = 5};
	kiln_stream_options o = {.chunk_size = 65536, .on_chunk = on_chunk, .ctx = &l};
	kiln_stream_result res;
	kiln_error err;
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &o, &res, &err), KILN_CANCELED);
	cr_assert_eq(l.chunks, 5, "no callback after the one that said stop");
	for (int i = 0; i < NT; i++)
		free(dests[i]);
	kiln_model_close(dir);
}

Test(load, stream_from_a_borrowed_buffer)
{
	blob b = build(spec, NT);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	kiln_error err;
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, NULL, NULL, &err), 0, "%s", err.message);
	for (int i = 0; i < NT; i++) {
		cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
		free(dests[i]);
	}
	kiln_model_close(dir);
	blob_free(&b);
}

Test(load, stream_argument_errors)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln_error err;
	cr_assert_eq(kiln_stream(dir, NULL, 0, NULL, NULL, NULL, &err), KILN_INVAL);
	uint64_t bad = NT;
	void *d = malloc(8);
	cr_assert_eq(kiln_stream(dir, &bad, 1, &d, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, NT, "the error names the bad index");
	bad = (uint64_t)1 << 32; /* not cut to 32 bits (to index 0) */
	cr_assert_eq(kiln_stream(dir, &bad, 1, &d, NULL, NULL, &err), KILN_INVAL);
	kiln_stream_options o = {.engine = 9};
	uint64_t zero = 0;
	cr_assert_eq(kiln_stream(dir, &zero, 1, &d, &o, NULL, &err), KILN_INVAL);
	free(d);
	kiln_model_close(dir);
}

/* --- hints ----------------------------------------------------------------------------------- */

static size_t resident_pages(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p / 4096 * 4096;
	size_t n = ((uintptr_t)p + len - a + 4095) / 4096;
	unsigned char *v = malloc(n);
	cr_assert_eq(mincore((void *)a, n * 4096, v), 0);
	size_t r = 0;
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

Test(load, willneed_and_pageout_hints)
{
	int fd = open(path, O_RDONLY);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	const kiln_tensor *big = kiln_model_find_cstr(dir, "t4");
	uintptr_t first = (uintptr_t)big->data / 4096;
	size_t pages = ((uintptr_t)big->data + big->byte_length + 4095) / 4096 - first;
	cr_assert_lt(resident_pages(big->data, big->byte_length), pages / 2, "evicted first");
	uint64_t idx = big->index;
	kiln_error err;
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_WILLNEED, &err), 0, "%s",
		     err.message);
	/* Read-ahead is asynchronous and best effort: under memory pressure the kernel may drop a
	 * page it was asked for, so the advice is given again while waiting. A range that missed a
	 * page would still never bring it in. */
	for (int tries = 0; tries < 1000 && resident_pages(big->data, big->byte_length) < pages;
	     tries++) {
		usleep(5000);
		if (tries % 20 == 19)
			cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_WILLNEED, &err), 0);
	}
	cr_assert_eq(resident_pages(big->data, big->byte_length), pages, "%zu of %zu resident",
		     resident_pages(big->data, big->byte_length), pages);
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_PAGEOUT, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_DONTNEED, &err), 0);
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_COLD, &err), 0);
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, 17, &err), KILN_INVAL);
	uint64_t bad = NT;
	cr_assert_eq(kiln_tensor_hint(dir, &bad, 1, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	bad = (uint64_t)1 << 32 | big->index; /* not cut to 32 bits */
	cr_assert_eq(kiln_tensor_hint(dir, &bad, 1, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	kiln_model_close(dir);

	dir = open_with(KILN_SOURCE_READ, 0, 0, 0);
	cr_assert_eq(kiln_tensor_hint(dir, &idx, 1, KILN_HINT_WILLNEED, &err), KILN_UNSUPPORTED);
	kiln_model_close(dir);
}

/* --- pinning --------------------------------------------------------------------------------- */

struct pins {
	int pinned, unpinned;
	size_t bytes;
	int fail;
};

static int pin_hook(void *ctx, void *p, size_t len, kiln_error *why)
{
	struct pins *s = ctx;
	cr_assert_eq((uintptr_t)p % 4096, 0);
	cr_assert_eq(len % 4096, 0);
	cr_assert_not_null(why);
	cr_assert_eq(why->message[0], '\0', "the hook's error arrives zeroed");
	if (s->fail == 1) {
		why->sys_errno = EPERM;
		snprintf(why->message, sizeof(why->message), "device said no (%zu bytes)", len);
		return -1;
	}
	if (s->fail == 2)
		return 7; /* no reason given */
	s->pinned++;
	s->bytes += len;
	return 0;
}

static void unpin_hook(void *ctx, void *p, size_t len)
{
	(void)p;
	(void)len;
	((struct pins *)ctx)->unpinned++;
}

/* kB locked in the mapping that holds p, from /proc/self/smaps; -1 when not found. */
/* A field of /proc/self/smaps ("Locked", "Rss") for the mapping holding p, in KiB. */
static long smaps_kib(const void *p, const char *field)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	cr_assert_not_null(f);
	char line[512];
	int inside = 0;
	long kib = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b;
		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
			inside = (uintptr_t)p >= a && (uintptr_t)p < b;
		else if (inside && !strncmp(line, field, strlen(field)) &&
			 line[strlen(field)] == ':' &&
			 sscanf(line + strlen(field) + 1, "%ld kB", &kib) == 1)
			break;
	}
	fclose(f);
	return kib;
}

static long locked_kib(const void *p)
{
	return smaps_kib(p, "Locked");
}

/* A pin whose hook fails undoes its own mlock, but pages it shares with a live pin stay locked
 * (mlock does not count: the first munlock of a page unlocks it for every pin). */
Test(load, failed_pin_keeps_shared_pages_locked)
{
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	struct pins s = {0};
	kiln_pin_hooks h = {pin_hook, unpin_hook, &s};
	kiln_error err;
	/* Tensors 0 and 2 start in the same page. */
	const kiln_tensor *t0 = kiln_model_tensor(dir, 0), *t2 = kiln_model_tensor(dir, 2);
	cr_assert_eq((uintptr_t)t0->data / 4096, (uintptr_t)t2->data / 4096);
	cr_assert_eq(kiln_tensor_pin(dir, 0, &h, &err), 0, "%s", err.message);
	long before = locked_kib(t0->data);
	if (before == 0) /* AddressSanitizer makes mlock a no-op that reports success */
		cr_skip_test("mlock locks nothing in this build; nothing to observe");
	cr_assert_geq(before, 4, "pinning tensor 0 locked %ld kB", before);
	s.fail = 1;
	cr_assert_eq(kiln_tensor_pin(dir, 2, &h, &err), KILN_IO);
	cr_assert_eq(locked_kib(t0->data), before, "the failed pin unlocked tensor 0's page");
	cr_assert_eq(kiln_tensor_unpin(dir, 0, &err), 0);
	cr_assert_eq(locked_kib(t0->data), 0);
	kiln_model_close(dir);
}

Test(load, pin_unpin_and_close)
{
	for (unsigned src = 0; src <= 3; src++) {
		if (src == KILN_SOURCE_BUFFER)
			continue;
		kiln_model *dir = open_with(src, 0, 0, 0);
		struct pins s = {0};
		kiln_pin_hooks h = {pin_hook, unpin_hook, &s};
		kiln_error err;
		cr_assert_eq(kiln_tensor_pin(dir, 2, &h, &err), 0, "%s", err.message);
		cr_assert_eq(kiln_tensor_pin(dir, 2, &h, &err), 0); /* nested */
		cr_assert_eq(kiln_tensor_pin(dir, 3, &h, &err), 0);
		cr_assert_eq(s.pinned, 2, "a nested pin does not register twice");
		kiln_model_info info;
		kiln_model_get_info(dir, &info);
		cr_assert_eq(info.pinned, 3);
		cr_assert_eq(kiln_model_try_close(dir, &err), KILN_BUSY);
		cr_assert_not_null(strstr(err.message, "3 pinned"), "%s", err.message);
		cr_assert_eq(kiln_tensor_unpin(dir, 2, &err), 0);
		cr_assert_eq(s.unpinned, 0);
		cr_assert_eq(kiln_tensor_unpin(dir, 2, &err), 0);
		cr_assert_eq(s.unpinned, 1);
		cr_assert_eq(kiln_tensor_unpin(dir, 2, &err), KILN_INVAL);
		/* tensor 3 stays pinned: close unpins it through the hook */
		kiln_model_close(dir);
		cr_assert_eq(s.unpinned, 2);

		dir = open_with(src, 0, 0, 0);
		s = (struct pins){.fail = 1};
		cr_assert_eq(kiln_tensor_pin(dir, 4, &h, &err), KILN_IO);
		cr_assert_eq(err.sys_errno, EPERM);
		cr_assert_eq(err.tensor, 4);
		/* The hook's own words reach the caller. */
		cr_assert_not_null(
		    strstr(err.message, "the pin hook failed for tensor 4: device said no ("), "%s",
		    err.message);
		s.fail = 2;
		cr_assert_eq(kiln_tensor_pin(dir, 4, &h, &err), KILN_IO);
		cr_assert_eq(err.sys_errno, 0, "no errno unless the hook gives one");
		cr_assert_str_eq(err.message, "the pin hook failed for tensor 4: it returned 7");
		cr_assert_eq(kiln_tensor_pin(dir, 4, &h, NULL), KILN_IO, "err may be NULL");
		cr_assert_eq(kiln_model_try_close(dir, &err), 0,
			     "a failed pin leaves nothing pinned");
	}
	blob b = build(spec, NT);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	cr_assert_eq(kiln_tensor_pin(dir, 0, NULL, NULL), KILN_UNSUPPORTED);
	kiln_model_close(dir);
	blob_free(&b);
}

/* --- fault injection ------------------------------------------------------------------------- */

static int calls, fail_at, fail_errno, short_max;

static ssize_t fake_pread(int fd, void *buf, size_t len, off_t off)
{
	calls++;
	/* From the Nth read on, as a bad sector does: a gathered read that fails is read again a
	 * chunk at a time, and those reads must meet it too. */
	if (fail_at && calls >= fail_at) {
		errno = fail_errno;
		return -1;
	}
	if (short_max && len > (size_t)short_max)
		len = (size_t)short_max;
	return pread(fd, buf, len, off);
}

static int fake_result(int res, int fd, uint64_t off, size_t len)
{
	(void)fd;
	(void)off;
	(void)len;
	calls++;
	if (fail_at && calls == fail_at)
		return -fail_errno;
	if (short_max && res > short_max)
		return short_max; /* the kernel wrote more; kiln asks again for the rest */
	return res;
}

static void reset_faults(void)
{
	kiln__sys = kiln__sys_default;
	calls = fail_at = fail_errno = short_max = 0;
}

Test(faults, short_reads_are_completed)
{
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln__sys.pread = fake_pread;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = fake_result;
		short_max = 1000;
		kiln_model *dir = open_with(src, 0, 65536, 4);
		expect_same_bytes(dir, kiln_source_name(src));
		kiln_model_close(dir);
		cr_assert_gt(calls, 3000, "3 MiB in reads of at most 1000 bytes");
	}
	reset_faults();
}

static int interrupt_every_other(int res, int fd, uint64_t off, size_t len)
{
	(void)fd;
	(void)off;
	(void)len;
	return (calls++ % 2) ? res : (calls % 4 ? -EINTR : -EAGAIN);
}

static ssize_t pread_interrupted(int fd, void *buf, size_t len, off_t off)
{
	if (calls++ % 2 == 0) {
		errno = calls % 4 ? EINTR : EAGAIN;
		return -1;
	}
	return pread(fd, buf, len, off);
}

Test(faults, eintr_and_eagain_are_retried)
{
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln__sys.pread = pread_interrupted;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = interrupt_every_other;
		kiln_model *dir = open_with(src, 0, 65536, 4);
		expect_same_bytes(dir, kiln_source_name(src));
		kiln_model_close(dir);
	}
	reset_faults();
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln__sys.uring_result = interrupt_every_other;
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	kiln_stream_result res;
	/* The file is cached, where AUTO would pick pread: io_uring's retries are the point. */
	kiln_stream_options o = {.chunk_size = 65536, .engine = KILN_ENGINE_URING};
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &o, &res, NULL), 0);
	cr_assert_gt(res.retries, 10);
	for (int i = 0; i < NT; i++) {
		cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
		free(dests[i]);
	}
	reset_faults();
	kiln_model_close(dir);
}

Test(faults, eio_on_the_third_chunk)
{
	/* Open reads the header and the directory with two preads; the payload is the rest. */
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln__sys.pread = fake_pread;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = fake_result;
		fail_errno = EIO;
		fail_at = src == KILN_SOURCE_READ ? 2 + 3 : 3;
		kiln_open_options o = {.source = src, .chunk_size = 65536, .queue_depth = 4};
		kiln_model *dir = (kiln_model *)1;
		kiln_error err;
		cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_IO, "%s",
			     kiln_source_name(src));
		cr_assert_eq(err.sys_errno, EIO);
		cr_assert_null(dir, "nothing is left half-open");
	}
	/* And in a stream, with chunks in flight: all are reaped before it returns. */
	reset_faults();
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln__sys.uring_result = fake_result;
	fail_at = 3;
	fail_errno = EIO;
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	struct landing l = {0};
	kiln_stream_options o = {.engine = KILN_ENGINE_URING,
				 .chunk_size = 65536,
				 .queue_depth = 8,
				 .on_chunk = on_chunk,
				 .ctx = &l};
	kiln_error err;
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &o, NULL, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_lt(l.chunks, 3, "no chunk is delivered after the failure");
	for (int i = 0; i < NT; i++)
		free(dests[i]);
	reset_faults();
	kiln_model_close(dir);
}

static int refuse_direct(const char *p, int flags)
{
	if (flags & O_DIRECT) {
		errno = EINVAL;
		return -1;
	}
	return open(p, flags);
}

static int refuse_direct_reads(int res, int fd, uint64_t off, size_t len)
{
	(void)off;
	(void)len;
	return (fcntl(fd, F_GETFL) & O_DIRECT) ? -EINVAL : res;
}

Test(faults, odirect_refused_falls_back)
{
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln__sys.open = refuse_direct;
		kiln_model *dir = open_with(src, KILN_OPEN_DIRECT, 0, 0);
		kiln_model_info info;
		kiln_model_get_info(dir, &info);
		cr_assert_eq(info.direct, 0);
		cr_assert_eq(info.direct_fallback, EINVAL, "the fallback is reported");
		expect_same_bytes(dir, kiln_source_name(src));
		kiln_model_close(dir);
	}
	/* Refused at the first read instead of at open (some file systems do that). */
	reset_faults();
	kiln__sys.uring_result = refuse_direct_reads;
	kiln_model *dir = open_with(KILN_SOURCE_URING, KILN_OPEN_DIRECT, 65536, 4);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.direct, 0);
	cr_assert_eq(info.direct_fallback, EINVAL);
	expect_same_bytes(dir, "uring, direct refused mid-way");
	kiln_model_close(dir);
	reset_faults();
}

static int no_uring_errno;

static int no_uring(unsigned entries, void *ring)
{
	(void)entries;
	(void)ring;
	return -no_uring_errno;
}

Test(faults, io_uring_unavailable_falls_back_to_pread)
{
	const int errs[] = {ENOSYS, EPERM};
	for (int k = 0; k < 2; k++) {
		reset_faults();
		no_uring_errno = errs[k];
		kiln__sys.uring_init = no_uring;
		kiln_model *dir = open_with(KILN_SOURCE_URING, 0, 0, 0);
		kiln_model_info info;
		kiln_model_get_info(dir, &info);
		cr_assert_eq(info.uring_fallback, errs[k]);
		expect_same_bytes(dir, "uring unavailable");
		void *dests[NT];
		for (int i = 0; i < NT; i++)
			dests[i] = malloc(sizes[i] + 1);
		kiln_model_close(dir);
		/* A stream reads the file only for a mapped directory (the others copy). */
		dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
		kiln_stream_result res;
		kiln_stream_options so = {.engine = KILN_ENGINE_URING};
		cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &so, &res, NULL), 0);
		cr_assert_eq(res.engine, KILN_ENGINE_PREAD);
		cr_assert_eq(res.uring_fallback, errs[k]);
		for (int i = 0; i < NT; i++) {
			cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
			free(dests[i]);
		}
		kiln_model_close(dir);
	}
	reset_faults();
}

static int refuse_mlock(const void *addr, size_t len)
{
	(void)addr;
	(void)len;
	errno = ENOMEM;
	return -1;
}

Test(faults, mlock_refused_says_the_limit)
{
	reset_faults();
	kiln__sys.mlock = refuse_mlock;
	kiln_open_options o = {.flags = KILN_OPEN_LOCK};
	kiln_model *dir = (kiln_model *)1;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENOMEM);
	cr_assert_not_null(strstr(err.message, "RLIMIT_MEMLOCK"), "%s", err.message);
	cr_assert_null(dir);
	dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	cr_assert_eq(kiln_tensor_pin(dir, 4, NULL, &err), KILN_IO);
	cr_assert_not_null(strstr(err.message, "RLIMIT_MEMLOCK"), "%s", err.message);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.pinned, 0);
	reset_faults();
	cr_assert_eq(kiln_model_try_close(dir, &err), 0);
	/* With the real mlock it works (the 3 MiB tensor fits the default 8 MiB limit). */
	o = (kiln_open_options){.flags = KILN_OPEN_LOCK};
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), 0, "%s", err.message);
	kiln_model_close(dir);
}

/* ---- where a stream's bytes come from ---------------------------------------------------- */

Test(faults, owned_sources_stream_from_memory_not_the_file)
{
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln_model *dir = open_with(src, 0, 0, 0);
		/* The fault hooks with no fault set only count the file's reads. */
		kiln__sys.pread = fake_pread;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = fake_result;
		calls = 0;
		void *dests[NT];
		for (int i = 0; i < NT; i++)
			dests[i] = malloc(sizes[i] + 1);
		kiln_stream_options o = {.engine = KILN_ENGINE_URING, .chunk_size = 65536};
		kiln_stream_result res;
		kiln_error err;
		cr_assert_eq(kiln_stream(dir, NULL, 0, dests, &o, &res, &err), 0, "%s",
			     err.message);
		cr_assert_eq(calls, 0, "%s: the block is in memory; the file was read %d times",
			     kiln_source_name(src), calls);
		cr_assert_eq(res.engine, KILN_ENGINE_PREAD, "copies are reported as PREAD");
		for (int i = 0; i < NT; i++) {
			cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
			free(dests[i]);
		}
		/* kiln_model_read_all finds unreadable sectors: it always reads the file. */
		calls = 0;
		cr_assert_eq(kiln_model_read_all(dir, NULL, NULL, &err), 0, "%s", err.message);
		cr_assert_gt(calls, 0, "%s: read_all must read the file", kiln_source_name(src));
		kiln_model_close(dir);
	}
	reset_faults();
}

/* Pages of `path` in the page cache, through mincore on a fresh mapping; -1 on failure. */
static long cached_pages(size_t *total)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	fstat(fd, &st);
	size_t page = (size_t)sysconf(_SC_PAGESIZE), n = ((size_t)st.st_size + page - 1) / page;
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	unsigned char *v = malloc(n);
	long c = -1;
	if (m != MAP_FAILED && v && mincore(m, (size_t)st.st_size, v) == 0)
		for (size_t i = c = 0; i < n; i++)
			c += v[i] & 1;
	if (m != MAP_FAILED)
		munmap(m, (size_t)st.st_size);
	free(v);
	*total = n;
	return c;
}

/* Evict the test file; false when this file system keeps it cached (tmpfs). */
static int evict(void)
{
	int fd = open(path, O_RDONLY);
	fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	size_t total;
	long left = cached_pages(&total);
	return left >= 0 && (size_t)left < total;
}

Test(load, auto_engine_follows_the_page_cache)
{
	if (auto_engine_when_cached() != KILN_ENGINE_PREAD)
		cr_skip_test("no cachestat(2) in this kernel: AUTO is always io_uring here");
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(sizes[i] + 1);
	kiln_stream_result res;
	kiln_error err;
	/* Warm: every page asked for is cached (the whole file was just read through). */
	cr_assert_eq(kiln_model_read_all(dir, NULL, NULL, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.engine, KILN_ENGINE_PREAD, "a cached file is copied with pread");
	/* Cold: dropped from the page cache, so requests in flight pay. */
	if (!evict())
		cr_skip_test("cannot evict %s here", path);
	cr_assert_eq(kiln_stream(dir, NULL, 0, dests, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.engine, KILN_ENGINE_URING, "an uncached file is read with io_uring");
	for (int i = 0; i < NT; i++) {
		cr_assert_eq(memcmp(dests[i], data[i], sizes[i]), 0);
		free(dests[i]);
	}
	kiln_model_close(dir);
}

/* ---- KILN_SOURCE_AUTO ------------------------------------------------------------------- */

static kiln_model *open_auto(uint32_t flags, kiln_model_info *info)
{
	kiln_model *dir = open_with(KILN_SOURCE_AUTO, flags, 0, 0);
	kiln_model_get_info(dir, info);
	/* One file: its own choice is the model's. */
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	cr_assert_eq(fi.source, info->source);
	cr_assert_eq(fi.auto_choice, info->auto_choice);
	expect_same_bytes(dir, "auto");
	return dir;
}

Test(faults, auto_maps_and_populates_a_cached_file)
{
	reset_faults();
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	cr_assert_eq(kiln_model_read_all(dir, NULL, NULL, NULL), 0);
	/* A plain mapping has nothing mapped in yet: open reads the directory with pread. */
	kiln_model_info info;
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	long before = smaps_kib(fi.base, "Rss");
	kiln_model_close(dir);
	dir = open_with(KILN_SOURCE_AUTO, 0, 0, 0);
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP);
	cr_assert_eq(info.auto_choice, KILN_AUTO_CACHED);
	/* Populated: every page mapped at open, before anything touches the payload. */
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	cr_assert_eq(fi.auto_choice, KILN_AUTO_CACHED);
	long rss = smaps_kib(fi.base, "Rss");
	cr_assert_geq(rss, (long)(fi.size / 1024), "Rss %ld KiB of a %llu-byte file", rss,
		      (unsigned long long)fi.size);
	cr_assert_lt(before, rss);
	expect_same_bytes(dir, "auto, cached");
	kiln_model_close(dir);
	/* Not asked for: nothing to report. */
	dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.auto_choice, KILN_AUTO_NONE);
	kiln_model_close(dir);
}

/* An AUTO open of the evicted test file: mapped, and `choice` made. */
static kiln_model *open_cold_auto(uint32_t choice)
{
	if (!evict())
		cr_skip_test("cannot evict %s here", path);
	kiln_model *dir = open_with(KILN_SOURCE_AUTO, 0, 0, 0);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP);
	cr_assert_eq(info.auto_choice, choice);
	return dir;
}

Test(faults, auto_populates_a_cold_file_that_fits)
{
	reset_faults();
	kiln_model *dir = open_cold_auto(KILN_AUTO_COLD);
	/* Populated at open: every page is in before anything touches the payload. */
	size_t total;
	cr_assert_eq(cached_pages(&total), (long)total, "a cold AUTO open reads the whole file");
	expect_same_bytes(dir, "auto, cold");
	kiln_model_close(dir);
}

static uint64_t tiny_memory(void)
{
	return 4096;
}

Test(faults, auto_leaves_a_file_larger_than_memory_unpopulated)
{
	reset_faults();
	kiln__sys.mem_available = tiny_memory;
	kiln_model *dir = open_cold_auto(KILN_AUTO_LARGE);
	size_t total;
	cr_assert_lt(cached_pages(&total), (long)total, "nothing was populated");
	expect_same_bytes(dir, "auto, large");
	kiln_model_close(dir);
	reset_faults();
}

Test(faults, auto_reads_a_file_that_cannot_be_mapped)
{
	reset_faults();
	kiln__sys.mmap = kt_mmap_enodev;
	kiln_model_info info;
	kiln_model *dir = open_auto(0, &info);
	cr_assert_eq(info.source, KILN_SOURCE_READ);
	cr_assert_eq(info.auto_choice, KILN_AUTO_UNMAPPABLE);
	kiln_model_close(dir);
	/* Asked for by name, the mapping's failure is the answer. */
	kiln_open_options o = {.source = KILN_SOURCE_MMAP};
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENODEV);
	reset_faults();
}

Test(faults, auto_with_owned_options_reads_with_io_uring)
{
	reset_faults();
	kiln_model_info info;
	kiln_model *dir = open_auto(KILN_OPEN_DIRECT, &info);
	cr_assert_eq(info.source, KILN_SOURCE_URING);
	cr_assert_eq(info.auto_choice, KILN_AUTO_OWNED);
	kiln_model_close(dir);
	cr_assert_str_eq(kiln_source_name(KILN_SOURCE_AUTO), "auto");
}

Test(faults, auto_sees_a_file_whose_end_is_not_cached)
{
	reset_faults();
	kiln_model *dir = open_with(KILN_SOURCE_MMAP, 0, 0, 0);
	cr_assert_eq(kiln_model_read_all(dir, NULL, NULL, NULL), 0);
	kiln_model_close(dir);
	/* Only the last 32 KiB dropped: the sample must reach the file's end. */
	int fd = open(path, O_RDONLY);
	struct stat sb;
	fstat(fd, &sb);
	posix_fadvise(fd, sb.st_size - 32768, 32768, POSIX_FADV_DONTNEED);
	close(fd);
	size_t total;
	long cached = cached_pages(&total);
	if (cached < 0 || (size_t)cached == total)
		cr_skip_test("cannot evict part of %s here", path);
	kiln_model_info info;
	dir = open_auto(0, &info);
	cr_assert_eq(info.auto_choice, KILN_AUTO_COLD, "a tail out of the cache is not 'cached'");
	kiln_model_close(dir);
}

/* --- threaded loads ------------------------------------------------------------------------ */

/* A file big enough for several 2 MiB parts: 8 MiB and a bit, in tensors that straddle the part
 * boundaries at odd offsets. */
static char *threads_file(uint8_t **bytes, uint64_t *lens, kiln_tensor_spec *t)
{
	static const uint64_t n[4] = {3, (5u << 20) + 123, 4097, (3u << 20) + 7};
	static const char *const names[4] = {"a", "b", "c", "d"};
	uint64_t x = 7;
	for (int i = 0; i < 4; i++) {
		lens[i] = n[i];
		bytes[i] = malloc(n[i]);
		fill_random(bytes[i], n[i], &x);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = 1,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {n[i]},
					  .data = bytes[i]};
	}
	char *dir = temp_dir(), *p;
	cr_assert(asprintf(&p, "%s/threads.klnt", dir) > 0);
	free(dir);
	kiln_error err;
	cr_assert_eq(kiln_write_file(p, t, 4, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err), 0,
		     "%s", err.message);
	return p;
}

Test(load, threads_give_the_same_bytes)
{
	uint8_t *bytes[4];
	uint64_t lens[4];
	kiln_tensor_spec t[4];
	char *p = threads_file(bytes, lens, t);
	static const uint32_t threads[] = {0, 1, 2, 3, 8, 64};
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++)
		for (uint32_t flags = 0; flags <= KILN_OPEN_DIRECT; flags += KILN_OPEN_DIRECT)
			for (size_t k = 0; k < sizeof(threads) / sizeof(threads[0]); k++) {
				kiln_open_options o = {.source = src,
						       .flags = flags,
						       .chunk_size = k % 2 ? 1000000 : 0,
						       .threads = threads[k]};
				kiln_model *dir;
				kiln_error err;
				cr_assert_eq(kiln_model_open(p, &o, &dir, &err), 0, "%s",
					     err.message);
				kiln_model_info info;
				kiln_model_get_info(dir, &info);
				if (flags)
					cr_assert_eq(info.direct, 1, "every part read directly");
				for (uint32_t i = 0; i < 4; i++)
					cr_assert_eq(memcmp(kiln_model_tensor(dir, i)->data,
							    bytes[i], lens[i]),
						     0,
						     "%s, flags %u, %u threads: tensor %u differs",
						     kiln_source_name(src), flags, threads[k], i);
				kiln_model_close(dir);
			}
	/* Into a caller's load buffer, 64-byte but not page aligned: parts land at their offsets,
	 * O_DIRECT through bounce buffers where the memory is not aligned for it. */
	struct stat st;
	cr_assert_eq(stat(p, &st), 0);
	size_t cap = ((size_t)st.st_size + 4095) / 4096 * 4096 + 4096;
	uint8_t *raw = aligned_alloc(4096, cap + 4096);
	for (uint32_t flags = 0; flags <= KILN_OPEN_DIRECT; flags += KILN_OPEN_DIRECT) {
		kiln_open_options o = {.source = KILN_SOURCE_URING,
				       .flags = flags,
				       .threads = 3,
				       .buffer = raw + 64,
				       .buffer_size = cap};
		kiln_model *dir;
		kiln_error err;
		cr_assert_eq(kiln_model_open(p, &o, &dir, &err), 0, "%s", err.message);
		for (uint32_t i = 0; i < 4; i++)
			cr_assert_eq(memcmp(kiln_model_tensor(dir, i)->data, bytes[i], lens[i]), 0,
				     "load buffer, flags %u: tensor %u differs", flags, i);
		kiln_model_close(dir);
	}
	free(raw);
	unlink(p);
	free(p);
	for (int i = 0; i < 4; i++)
		free(bytes[i]);
}

/* A read failing at one offset, whichever thread issues it. */
static uint64_t bad_off;

static ssize_t pread_bad_at(int fd, void *buf, size_t len, off_t off)
{
	if ((uint64_t)off <= bad_off && bad_off < (uint64_t)off + len) {
		errno = EIO;
		return -1;
	}
	return pread(fd, buf, len, off);
}

static int result_bad_at(int res, int fd, uint64_t off, size_t len)
{
	(void)fd;
	return off <= bad_off && bad_off < off + len ? -EIO : res;
}

Test(faults, eio_in_one_part_of_a_threaded_load)
{
	uint8_t *bytes[4];
	uint64_t lens[4];
	kiln_tensor_spec t[4];
	char *p = threads_file(bytes, lens, t);
	bad_off = (5u << 20) + 4096; /* in the third of four 2 MiB parts */
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++) {
		reset_faults();
		kiln__sys.pread = pread_bad_at;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln__sys.uring_result = result_bad_at;
		kiln_open_options o = {.source = src, .chunk_size = 65536, .threads = 4};
		kiln_model *dir = (kiln_model *)1;
		kiln_error err;
		cr_assert_eq(kiln_model_open(p, &o, &dir, &err), KILN_IO, "%s",
			     kiln_source_name(src));
		cr_assert_eq(err.sys_errno, EIO);
		cr_assert_not_null(strstr(err.message, "failed"), "%s", err.message);
		cr_assert_null(dir, "nothing is left half-open");
	}
	reset_faults();
	unlink(p);
	free(p);
	for (int i = 0; i < 4; i++)
		free(bytes[i]);
}

/* --- sequential advice on a cold file --------------------------------------------------------- */

static uint64_t positioned_at;
static int positioned;

static ssize_t pread_watch(int fd, void *buf, size_t len, off_t off)
{
	if (len == 1) {
		positioned++;
		positioned_at = (uint64_t)off;
	}
	return pread(fd, buf, len, off);
}

/* Sequential advice on a file whose directory (more than a page) came from the disk: open ends
 * with a 1-byte read of the directory's last byte, so the kernel's read position is where the
 * payload starts and the first fault on it starts sequential read-ahead (see load_file). Not
 * when the directory was cached, nor for other advice. */
Test(faults, sequential_advice_on_a_cold_file_sets_the_read_position)
{
	enum { N = 64 };
	kiln_tensor_spec t[N];
	static uint8_t bytes[N][4096];
	char names[N][8];
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "w%d", i);
		memset(bytes[i], i + 1, sizeof(bytes[i]));
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {sizeof(bytes[i])},
					  .data = bytes[i]};
	}
	char *dir_name = temp_dir(), *p;
	cr_assert(asprintf(&p, "%s/seq.klnt", dir_name) > 0);
	free(dir_name);
	kiln_error err;
	cr_assert_eq(kiln_write_file(p, t, N, KILN_WRITE_NO_DIGESTS, &err), 0, "%s", err.message);
	int fd = open(p, O_RDONLY);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	/* A file system that keeps its pages regardless (tmpfs) cannot make a file cold. */
	void *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
	unsigned char vec[2] = {1, 1};
	cr_assert_neq(m, MAP_FAILED);
	mincore(m, 8192, vec);
	munmap(m, 8192);
	close(fd);
	if (vec[1] & 1) {
		unlink(p);
		free(p);
		cr_skip_test("cannot drop the test file's pages here");
	}
	static const unsigned advice[] = {KILN_ADVICE_NORMAL, KILN_ADVICE_SEQUENTIAL,
					  KILN_ADVICE_SEQUENTIAL};
	for (int k = 0; k < 3; k++) {
		reset_faults();
		kiln__sys.pread = pread_watch;
		kiln__sys.preadv = kt_preadv_by_pread;
		positioned = 0;
		kiln_open_options o = {.advice = advice[k]};
		kiln_model *dir;
		cr_assert_eq(kiln_model_open(p, &o, &dir, &err), 0, "%s", err.message);
		kiln_file_info info;
		cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
		cr_assert_gt(info.payload_base, 4096, "a directory of more than a page");
		/* Open 0 reads the cold directory with no advice, so open 1 finds it cold only
		 * after it is dropped again; open 2 finds it cached. */
		if (k == 1)
			cr_assert_eq(positioned, 1, "cold, sequential: one positioning read");
		else
			cr_assert_eq(positioned, 0, "open %d: no positioning read", k);
		if (k == 1)
			cr_assert_eq(positioned_at, info.payload_base - 1);
		kiln_model_close(dir);
		if (k == 0) {
			fd = open(p, O_RDONLY);
			posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
	reset_faults();
	unlink(p);
	free(p);
}
