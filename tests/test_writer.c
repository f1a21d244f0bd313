/* SPDX-License-Identifier: MIT */
/* The canonical writer: it refuses what the reader rejects (same class), streams payloads,
 * and replaces files by rename so a reader's mapping is never truncated under it. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"

static const uint8_t f32_2[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};

static void check_err(int rc, const kiln_error *err, int code, uint64_t tensor, const char *field)
{
	cr_assert_eq(rc, code, "got %s (%s), want %s", kiln_code_name(rc), err->message,
		     kiln_code_name(code));
	cr_assert_eq(err->tensor, tensor, "tensor %" PRIu64 ": %s", err->tensor, err->message);
	if (field)
		cr_assert(err->field && !strcmp(err->field, field), "field %s: %s", err->field,
			  err->message);
}

/* write_memory and write_file refuse the same way and leave nothing behind. */
static void expect_write_refused(const kiln_tensor_spec *t, uint32_t n, int code, uint64_t tensor,
				 const char *field)
{
	kiln_error err;
	static uint8_t buf[1 << 17];
	size_t written = 7;
	check_err(kiln_write_memory(t, n, buf, sizeof(buf), &written, &err), &err, code, tensor,
		  field);
	cr_assert_eq(written, 0);
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/out.klnt", dir) > 0);
	check_err(kiln_write_file(path, t, n, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		  &err, code, tensor, field);
	cr_assert_eq(access(path, F_OK), -1);
	cr_assert_eq(rmdir(dir), 0, "the temporary file was left behind");
	free(path);
	free(dir);
}

/* Refused already when planned (kiln_write_size), then by both writers. */
static void expect_refused(const kiln_tensor_spec *t, uint32_t n, int code, uint64_t tensor,
			   const char *field)
{
	kiln_error err;
	check_err(kiln_write_size(t, n, NULL, &err), &err, code, tensor, field);
	expect_write_refused(t, n, code, tensor, field);
}

Test(refuse, heap_slice_at_0xffff_is_limit)
{
	/* Name 0 fills offsets [0, 65534); name 1 starts at 65534 (the last encodable offset) and
	 * name 2 would start at 65535, which is "none". */
	char *big = malloc(65534);
	memset(big, 'n', 65534);
	kiln_tensor_spec t[3] = {
	    {.name = big, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "b", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "c", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	cr_assert_eq(kiln_write_size(t, 2, NULL, NULL), 0, "a slice at 65534 is fine");
	expect_refused(t, 3, KILN_LIMIT, 2, "name_off");
	/* The same for a layout name that would start at 65535. */
	kiln_tensor_spec u[2] = {
	    {.name = big, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "b",
	     .name_len = 1,
	     .dtype = 4096,
	     .rank = 0,
	     .layout = "L",
	     .layout_len = 1,
	     .block_size = 1,
	     .byte_length = 1,
	     .data = "x"},
	};
	expect_refused(u, 2, KILN_LIMIT, 1, "layout_off");
	free(big);
}

Test(refuse, name_longer_than_u16_is_limit)
{
	char *big = calloc(1, 70000);
	memset(big, 'a', 70000);
	kiln_tensor_spec t = {
	    .name = big, .name_len = 65536, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&t, 1, KILN_LIMIT, 0, "name_len");
	t.name_len = 65535; /* longest encodable name, at offset 0 */
	cr_assert_eq(kiln_write_size(&t, 1, NULL, NULL), 0);
	free(big);
}

Test(refuse, bad_utf8_name_is_utf8)
{
	kiln_tensor_spec t = {
	    .name = "\xed\xa0\x80", .name_len = 3, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&t, 1, KILN_UTF8, 0, "name");
	kiln_tensor_spec o = {.dtype = 5000,
			      .rank = 0,
			      .layout = "\xc0\xaf",
			      .layout_len = 2,
			      .block_size = 1,
			      .byte_length = 1,
			      .data = "x"};
	expect_refused(&o, 1, KILN_UTF8, 0, "layout");
}

Test(refuse, names_all_or_none)
{
	kiln_tensor_spec t[2] = {
	    {.name = "a", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	expect_refused(t, 2, KILN_TYPE, 1, "name_off");
	t[1] = t[0];
	t[0].name = NULL;
	t[0].name_len = 0;
	expect_refused(t, 2, KILN_TYPE, 1, "name_off");
	kiln_tensor_spec e = {
	    .name = "", .name_len = 0, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&e, 1, KILN_TYPE, 0, "name_len");
}

Test(refuse, duplicate_names_are_type)
{
	kiln_tensor_spec t[3] = {
	    {.name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "v", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	expect_refused(t, 3, KILN_TYPE, 2, "name");
}

Test(refuse, dtype_shape_and_length)
{
	kiln_tensor_spec t = {.dtype = 20, .rank = 1, .shape = {2}, .byte_length = 2, .data = "xx"};
	expect_refused(&t, 1, KILN_TYPE, 0, "dtype");
	t = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 9, .byte_length = 1, .data = "x"};
	expect_refused(&t, 1, KILN_TYPE, 0, "rank");
	t = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 1, .shape = {1, 5}, .data = "x"};
	expect_refused(&t, 1, KILN_TYPE, 0, "shape");
	t = (kiln_tensor_spec){.dtype = KILN_DT_F32, .rank = 2, .shape = {1ull << 40, 1ull << 40}};
	expect_refused(&t, 1, KILN_LIMIT, 0, "shape");
	t = (kiln_tensor_spec){.dtype = KILN_DT_F64, .rank = 1, .shape = {1ull << 61}};
	expect_refused(&t, 1, KILN_LIMIT, 0, "shape");
	t = (kiln_tensor_spec){
	    .dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .byte_length = 9, .data = f32_2};
	expect_refused(&t, 1, KILN_TYPE, 0, "byte_length");
}

Test(refuse, opaque_rules)
{
	kiln_tensor_spec t = {
	    .dtype = 4096, .rank = 0, .block_size = 2, .byte_length = 2, .data = "xx"};
	expect_refused(&t, 1, KILN_TYPE, 0, "layout_off");
	t.layout = "L";
	t.layout_len = 1;
	t.block_size = 0;
	expect_refused(&t, 1, KILN_TYPE, 0, "block_size");
	t.block_size = 3;
	expect_refused(&t, 1, KILN_TYPE, 0, "byte_length");
	kiln_tensor_spec p = {
	    .dtype = KILN_DT_U8, .rank = 0, .layout = "L", .layout_len = 1, .data = "x"};
	expect_refused(&p, 1, KILN_TYPE, 0, "layout_off");
	p = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 0, .block_size = 1, .data = "x"};
	expect_refused(&p, 1, KILN_TYPE, 0, "block_size");
}

Test(refuse, quant_rules)
{
	uint8_t d[32] = {0};
	kiln_tensor_spec t[3] = {
	    {.dtype = KILN_DT_I8,
	     .rank = 1,
	     .shape = {8},
	     .quant_scheme = 1,
	     .group_size = 4,
	     .scale_index = 1,
	     .data = d},
	    {.dtype = KILN_DT_F16, .rank = 1, .shape = {2}, .data = d},
	    {.dtype = KILN_DT_F32, .rank = 0, .data = d},
	};
	cr_assert_eq(kiln_write_size(t, 3, NULL, NULL), 0);
	t[0].group_size = 2; /* 4 groups, 2 scales */
	expect_refused(t, 3, KILN_TYPE, 0, "scale_index");
	t[0].group_size = 4;
	t[1].dtype = KILN_DT_I16;
	expect_refused(t, 3, KILN_TYPE, 0, "scale_index");
	t[1].dtype = KILN_DT_F16;
	t[0].quant_scheme = 2;
	t[0].outer_index = 1;
	expect_refused(t, 3, KILN_TYPE, 0, "outer_index");
	t[0].outer_index = 2;
	cr_assert_eq(kiln_write_size(t, 3, NULL, NULL), 0);
	t[0].quant_axis = 1;
	expect_refused(t, 3, KILN_TYPE, 0, "quant_axis");
	t[0].quant_axis = 0;
	t[0].quant_scheme = 3;
	expect_refused(t, 3, KILN_TYPE, 0, "quant_scheme");
	/* Scheme 0 ignores stray quant fields and writes "none". */
	t[0].quant_scheme = 0;
	t[0].group_size = 99;
	blob b = build(t, 3);
	cr_assert_eq(b.p[D(0) + F_GROUP], 0);
	cr_assert_eq(b.p[D(0) + F_SCALE], 0xFF);
	blob_free(&b);
}

Test(refuse, odd_four_bit_padding_is_type)
{
	static const uint8_t d[2] = {0x21, 0x53};
	kiln_tensor_spec t = {.dtype = KILN_DT_U4, .rank = 1, .shape = {3}, .data = d};
	cr_assert_eq(kiln_write_size(&t, 1, NULL, NULL), 0, "planning does not read payloads");
	expect_write_refused(&t, 1, KILN_TYPE, 0, "payload padding");
}

Test(refuse, buffer_too_small_is_limit)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	uint8_t buf[199];
	size_t w;
	kiln_error err;
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), KILN_LIMIT);
	uint64_t need;
	cr_assert_eq(kiln_write_size(&t, 1, &need, NULL), 0);
	cr_assert_eq(need, 200);
}

Test(refuse, missing_payload_is_inval)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}};
	uint8_t buf[256];
	size_t w;
	kiln_error err;
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), KILN_INVAL);
	t.shape[0] = 0; /* an empty tensor needs no payload */
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), 0, "%s", err.message);
}

/* Streaming: a callback that makes a byte pattern, and one that fails on a chosen call. */
struct pattern {
	unsigned calls, fail_at;
	size_t max_len;
};

static int pattern_read(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	struct pattern *p = ctx;
	if (++p->calls == p->fail_at)
		return EIO;
	if (len > p->max_len)
		p->max_len = len;
	uint8_t *b = buf;
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)((offset + i) * 7 + tensor);
	return 0;
}

static long max_rss_kib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

Test(file, streams_payload_in_chunks, .timeout = 120)
{
	const uint64_t size = 256ull << 20;
	struct pattern p = {0};
	kiln_tensor_spec t[2] = {
	    {.name = "big",
	     .name_len = 3,
	     .dtype = KILN_DT_U8,
	     .rank = 1,
	     .shape = {size},
	     .read = pattern_read,
	     .read_ctx = &p},
	    {.name = "small",
	     .name_len = 5,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	};
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/big.klnt", dir) > 0);
	long before = max_rss_kib();
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, t, 2, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	long grew = max_rss_kib() - before;
	cr_assert_lt(grew, 32 * 1024, "writing 256 MiB grew the peak RSS by %ld KiB", grew);
	cr_assert_leq(p.max_len, 4u << 20, "chunks of at most a few MiB, got %zu", p.max_len);
	cr_assert_gt(p.calls, 1);

	kiln_model *d;
	kiln_open_options o = {.flags = KILN_OPEN_VERIFY_PAYLOAD};
	cr_assert_eq(kiln_model_open(path, &o, &d, &err), 0, "%s", err.message);
	const uint8_t *b = kiln_model_find_cstr(d, "big")->data;
	for (uint64_t i = 0; i < size; i += 4093)
		cr_assert_eq(b[i], (uint8_t)(i * 7), "byte %llu", (unsigned long long)i);
	cr_assert_eq(memcmp(kiln_model_find_cstr(d, "small")->data, f32_2, 8), 0);
	kiln_model_close(d);
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, callback_failure_leaves_target_untouched)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/t.klnt", dir) > 0);
	kiln_tensor_spec ok = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	cr_assert_eq(kiln_write_file(path, &ok, 1, 0, NULL), 0);

	struct pattern p = {.fail_at = 3};
	kiln_tensor_spec t = {.dtype = KILN_DT_U8,
			      .rank = 1,
			      .shape = {5u << 20},
			      .read = pattern_read,
			      .read_ctx = &p};
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, &t, 1, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	kiln_model *d;
	cr_assert_eq(kiln_model_open(path, NULL, &d, &err), 0, "the old file is intact: %s",
		     err.message);
	cr_assert_eq(kiln_model_tensor(d, 0)->byte_length, 8);
	kiln_model_close(d);
	DIR *dh = opendir(dir);
	int entries = 0;
	for (struct dirent *e; (e = readdir(dh));)
		entries += e->d_name[0] != '.';
	closedir(dh);
	cr_assert_eq(entries, 1, "only the target remains, no temporary file");
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, rewrite_keeps_an_open_mapping_intact)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/m.klnt", dir) > 0);
	static uint8_t old_data[1 << 16], new_data[16];
	memset(old_data, 0xAB, sizeof(old_data));
	kiln_tensor_spec a = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizeof(old_data)}, .data = old_data};
	cr_assert_eq(kiln_write_file(path, &a, 1, 0, NULL), 0);
	kiln_model *d;
	cr_assert_eq(kiln_model_open(path, NULL, &d, NULL), 0);

	/* Replace it with a much shorter file while the old one is mapped. */
	kiln_tensor_spec b = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizeof(new_data)}, .data = new_data};
	cr_assert_eq(kiln_write_file(path, &b, 1, 0, NULL), 0);
	const uint8_t *p = kiln_model_tensor(d, 0)->data;
	for (size_t i = 0; i < sizeof(old_data); i += 512)
		cr_assert_eq(p[i], 0xAB); /* a truncation would have raised SIGBUS here */
	kiln_model_close(d);
	cr_assert_eq(kiln_model_open(path, NULL, &d, NULL), 0);
	cr_assert_eq(kiln_model_tensor(d, 0)->byte_length, sizeof(new_data));
	kiln_model_close(d);
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, unwritable_directory_is_io)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	kiln_error err;
	cr_assert_eq(kiln_write_file(KILN_TEST_TMP "/no/such/dir/x.klnt", &t, 1, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_not_null(strstr(err.message, "x.klnt"));
}

/* --- kiln_write_file: what a directory holds during and after a write ---------------------- */

/* The entries of dir other than "." and "..", as "name,name,..." sorted by readdir order, and
 * their number. */
static int list_dir(const char *dir, char *names, size_t cap)
{
	DIR *dh = opendir(dir);
	cr_assert_not_null(dh, "opendir %s", dir);
	int n = 0;
	if (cap)
		names[0] = '\0';
	for (struct dirent *e; (e = readdir(dh));) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		n++;
		if (cap && strlen(names) + strlen(e->d_name) + 2 < cap) {
			strcat(names, e->d_name);
			strcat(names, ",");
		}
	}
	closedir(dh);
	return n;
}

static int entries(const char *dir)
{
	return list_dir(dir, NULL, 0);
}

/* A payload callback that fills bytes with `value`, looks into `dir` on its first call (what a
 * reader of the directory sees while the file is being written), and fails or stops on a chosen
 * call. */
struct watch {
	const char *dir;
	uint8_t value;
	unsigned calls, fail_at, kill_at;
	int fail_with;
	int seen; /* entries in dir at the first call */
	char names[4096];
};

static int watch_read(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	struct watch *w = ctx;
	(void)tensor;
	(void)offset;
	if (++w->calls == 1 && w->dir)
		w->seen = list_dir(w->dir, w->names, sizeof(w->names));
	if (w->calls == w->kill_at)
		raise(SIGKILL);
	if (w->calls == w->fail_at)
		return w->fail_with ? w->fail_with : EIO;
	memset(buf, w->value, len);
	return 0;
}

/* Write one u8 tensor of `len` bytes of `value` through watch_read. */
static int write_u8(const char *path, struct watch *w, uint64_t len, uint32_t flags,
		    kiln_error *err)
{
	kiln_tensor_spec t = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {len}, .read = watch_read, .read_ctx = w};
	return kiln_write_file(path, &t, 1, flags, err);
}

/* The first payload byte of the file at path (and that it opens). */
static int first_byte(const char *path)
{
	kiln_model *d;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &d, &err), 0, "%s: %s", path, err.message);
	int b = ((const uint8_t *)kiln_model_tensor(d, 0)->data)[0];
	kiln_model_close(d);
	return b;
}

static int tmpfile_supported(const char *dir)
{
	int fd = open(dir, O_TMPFILE | O_WRONLY, 0600);
	if (fd >= 0)
		close(fd);
	return fd >= 0;
}

/* Fault injection through the system-call table (src/base/sys.h). Each test runs in its own
 * process, so a replaced entry never leaks into another test. */
static int refuse_tmpfile_with = EOPNOTSUPP;
static int open_no_tmpfile(int dirfd, const char *path, int flags, mode_t mode)
{
	if ((flags & O_TMPFILE) == O_TMPFILE) {
		errno = refuse_tmpfile_with;
		return -1;
	}
	return openat(dirfd, path, flags, mode);
}

static int open_dir_refused(int dirfd, const char *path, int flags, mode_t mode)
{
	if ((flags & O_TMPFILE) != O_TMPFILE && (flags & O_DIRECTORY)) {
		errno = EACCES;
		return -1;
	}
	return openat(dirfd, path, flags, mode);
}

static int fsync_fails_on(int fd, int dir)
{
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	if (!S_ISDIR(st.st_mode) == !dir) {
		errno = EIO;
		return -1;
	}
	return fsync(fd);
}
static int fsync_dir_eio(int fd)
{
	return fsync_fails_on(fd, 1);
}
static int fsync_file_eio(int fd)
{
	return fsync_fails_on(fd, 0);
}
static int rename_eio(int a, const char *b, int c, const char *d)
{
	(void)a, (void)b, (void)c, (void)d;
	errno = EIO;
	return -1;
}
static int link_enospc(int a, const char *b, int c, const char *d, int f)
{
	(void)a, (void)b, (void)c, (void)d, (void)f;
	errno = ENOSPC;
	return -1;
}

/* A scratch directory holding `name` written with bytes of `value`. */
static char *dir_with(const char *name, uint8_t value, char **path)
{
	char *dir = temp_dir();
	cr_assert(asprintf(path, "%s/%s", dir, name) > 0);
	struct watch w = {.value = value};
	kiln_error err;
	struct kiln__sys faults = kiln__sys; /* written without them */
	kiln__sys = kiln__sys_default;
	cr_assert_eq(write_u8(*path, &w, 100, 0, &err), 0, "%s", err.message);
	kiln__sys = faults;
	return dir;
}

/* Remove a scratch directory and everything in it (one level). */
static void drop_dir(char *dir)
{
	DIR *dh = opendir(dir);
	for (struct dirent *e; dh && (e = readdir(dh));) {
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			char *p;
			cr_assert(asprintf(&p, "%s/%s", dir, e->d_name) > 0);
			if (unlink(p) != 0)
				rmdir(p);
			free(p);
		}
	}
	if (dh)
		closedir(dh);
	cr_assert_eq(rmdir(dir), 0, "rmdir %s: %s", dir, strerror(errno));
	free(dir);
}

Test(file, nothing_is_visible_while_writing)
{
	char *dir = temp_dir(), *path;
	if (!tmpfile_supported(dir))
		cr_skip_test("the scratch file system has no O_TMPFILE");
	cr_assert(asprintf(&path, "%s/new.klnt", dir) > 0);
	struct watch w = {.dir = dir, .value = 1};
	kiln_error err;
	cr_assert_eq(write_u8(path, &w, 3u << 20, 0, &err), 0, "%s", err.message);
	cr_assert_eq(w.seen, 0, "visible while writing a new file: %s", w.names);
	cr_assert_eq(first_byte(path), 1);
	/* Replacing: only the old file is there until the end. */
	w = (struct watch){.dir = dir, .value = 2};
	cr_assert_eq(write_u8(path, &w, 3u << 20, 0, &err), 0, "%s", err.message);
	cr_assert_eq(w.seen, 1, "visible while replacing: %s", w.names);
	cr_assert_str_eq(w.names, "new.klnt,");
	cr_assert_eq(first_byte(path), 2);
	cr_assert_eq(entries(dir), 1);
	free(path);
	drop_dir(dir);
}

Test(file, a_killed_writer_leaves_nothing_behind)
{
	char *dir = temp_dir(), *path;
	if (!tmpfile_supported(dir))
		cr_skip_test("the scratch file system has no O_TMPFILE");
	cr_assert(asprintf(&path, "%s/k.klnt", dir) > 0);
	for (int replace = 0; replace < 2; replace++) {
		pid_t pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0) {
			struct watch w = {.value = 9, .kill_at = 3};
			write_u8(path, &w, 8u << 20, 0, NULL);
			_exit(0);
		}
		int status;
		cr_assert_eq(waitpid(pid, &status, 0), pid);
		cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
		cr_assert_eq(entries(dir), replace, "a killed write left a file behind");
		if (replace)
			cr_assert_eq(first_byte(path), 7, "the old file is intact");
		struct watch w = {.value = 7};
		cr_assert_eq(write_u8(path, &w, 100, 0, NULL), 0);
	}
	free(path);
	drop_dir(dir);
}

/* Without O_TMPFILE: a hidden file with a random name, gone when the call returns. Names that
 * older versions would have used (PID and a counter) do not get in the way. */
static void fallback_case(int refusal)
{
	refuse_tmpfile_with = refusal;
	kiln__sys.openat = open_no_tmpfile;
	char *path, *dir = dir_with("f.klnt", 1, &path);
	int squatted = 0;
	for (unsigned i = 0; i < 100; i++) {
		char *p;
		cr_assert(asprintf(&p, "%s/.kiln-tmp.%ld.%u", dir, (long)getpid(), i) > 0);
		int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
		squatted += fd >= 0;
		close(fd);
		free(p);
	}
	char first[64] = "";
	for (int round = 0; round < 2; round++) {
		struct watch w = {.dir = dir, .value = (uint8_t)(2 + round)};
		kiln_error err;
		cr_assert_eq(write_u8(path, &w, 3u << 20, 0, &err), 0, "%s", err.message);
		cr_assert_eq(w.seen, squatted + 2, "%s", w.names);
		/* The one name that is neither the target nor a squatter's. */
		char *tmp = NULL;
		for (char *s = strtok(w.names, ","); s; s = strtok(NULL, ","))
			if (strcmp(s, "f.klnt") && strncmp(s, ".kiln-tmp.", 10) == 0 &&
			    strlen(s) == 26)
				tmp = s;
		cr_assert_not_null(tmp, "no random temporary name");
		for (const char *c = tmp + 10; *c; c++)
			cr_assert(strchr("0123456789abcdef", *c), "%s", tmp);
		cr_assert_str_neq(tmp, first, "the same name twice");
		strcpy(first, tmp);
		cr_assert_eq(first_byte(path), 2 + round);
		cr_assert_eq(entries(dir), squatted + 1, "the temporary file is left");
	}
	/* A failed write removes it. */
	struct watch w = {.value = 5, .fail_at = 2};
	cr_assert_eq(write_u8(path, &w, 3u << 20, 0, NULL), KILN_IO);
	cr_assert_eq(entries(dir), squatted + 1, "the temporary file is left");
	cr_assert_eq(first_byte(path), 3);
	free(path);
	drop_dir(dir);
}

Test(file, without_tmpfile_a_random_name)
{
	fallback_case(EOPNOTSUPP);
}

Test(file, without_tmpfile_old_kernel)
{
	fallback_case(EISDIR);
}

Test(file, without_tmpfile_einval)
{
	fallback_case(EINVAL);
}

/* The rename happened, the directory sync did not: UNSYNCED, with the new file in place. */
static void expect_unsynced(int sys_errno)
{
	char *path, *dir = dir_with("u.klnt", 1, &path);
	struct watch w = {.value = 2};
	kiln_error err;
	cr_assert_eq(write_u8(path, &w, 100, 0, &err), KILN_UNSYNCED, "%s",
		     kiln_code_name(err.code));
	cr_assert_eq(err.code, KILN_UNSYNCED);
	cr_assert_eq(err.sys_errno, sys_errno);
	cr_assert_not_null(strstr(err.message, "u.klnt"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "in place"), "%s", err.message);
	cr_assert_eq(first_byte(path), 2, "the new file is in place");
	cr_assert_eq(entries(dir), 1);
	/* Nothing is synced with KILN_WRITE_NO_SYNC, so nothing can fail. */
	w.value = 3;
	cr_assert_eq(write_u8(path, &w, 100, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	cr_assert_eq(first_byte(path), 3);
	free(path);
	drop_dir(dir);
}

Test(file, directory_that_cannot_be_opened_is_unsynced)
{
	kiln__sys.openat = open_dir_refused;
	expect_unsynced(EACCES);
}

Test(file, directory_fsync_failure_is_unsynced)
{
	kiln__sys.fsync = fsync_dir_eio;
	expect_unsynced(EIO);
}

Test(file, unreadable_directory_is_unsynced)
{
	if (geteuid() == 0)
		cr_skip_test("root reads any directory; the fault-injected cases cover it");
	char *path, *dir = dir_with("r.klnt", 1, &path);
	cr_assert_eq(chmod(dir, 0300), 0);
	struct watch w = {.value = 2};
	kiln_error err;
	int rc = write_u8(path, &w, 100, 0, &err);
	cr_assert_eq(chmod(dir, 0700), 0);
	cr_assert_eq(rc, KILN_UNSYNCED, "%s", err.message);
	cr_assert_eq(err.sys_errno, EACCES);
	cr_assert_eq(first_byte(path), 2);
	free(path);
	drop_dir(dir);
}

/* A directory fsync that says so in one way or another. */
static int dir_fsync_errno;
static int fsync_dir_fails(int fd)
{
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	if (S_ISDIR(st.st_mode)) {
		errno = dir_fsync_errno;
		return -1;
	}
	return fsync(fd);
}

/* What kiln_write_file and kiln_write_series (one file, and a series of three) return, with
 * sys_errno, where the directory cannot be synced in the way `e` says (or cannot be opened,
 * `refuse_open`). */
static void publish_answers(int e, int refuse_open, int rc[3], int sys[3])
{
	char *dir = temp_dir(), *file, *one, *series;
	cr_assert(asprintf(&file, "%s/f.klnt", dir) > 0);
	cr_assert(asprintf(&one, "%s/o.klnt", dir) > 0);
	cr_assert(asprintf(&series, "%s/s.klnt", dir) > 0);
	dir_fsync_errno = e;
	kiln__sys.fsync = fsync_dir_fails;
	if (refuse_open)
		kiln__sys.openat = open_dir_refused;
	uint8_t bytes[64] = {1};
	kiln_tensor_spec t[3];
	for (int i = 0; i < 3; i++)
		t[i] = (kiln_tensor_spec){.name = i == 0   ? "a"
						  : i == 1 ? "b"
							   : "c",
					  .name_len = 1,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {64},
					  .data = bytes};
	kiln_error err;
	kiln_series_options o = {.size = sizeof(o), .max_shard_size = 64};
	kiln_series_result r;
	rc[0] = kiln_write_file(file, t, 3, 0, &err);
	sys[0] = rc[0] ? err.sys_errno : 0;
	rc[1] = kiln_write_series(one, t, 3, NULL, &r, &err);
	sys[1] = rc[1] ? err.sys_errno : 0;
	cr_assert_eq(r.files, 1);
	rc[2] = kiln_write_series(series, t, 3, &o, &r, &err);
	sys[2] = rc[2] ? err.sys_errno : 0;
	cr_assert_eq(r.files, 3, "%s", err.message);
	if (rc[2])
		cr_assert_not_null(strstr(err.message, "in place"), "%s", err.message);
	kiln__sys = kiln__sys_default;
	cr_assert_eq(first_byte(file), 1);
	cr_assert_eq(first_byte(one), 1);
	cr_assert_eq(entries(dir), 5, "every file in place, nothing else left");
	free(file);
	free(one);
	free(series);
	drop_dir(dir);
}

/* One publish routine: a file, a one-file series and a series of several get the same answer
 * where their directory cannot be synced. */
Test(file, a_file_and_a_series_agree_on_an_unsyncable_directory)
{
	static const struct {
		int e, refuse_open, want;
	} cases[] = {
	    {EINVAL, 0, 0},          /* the file system cannot sync a directory, and need not */
	    {EROFS, 0, 0},           /* the same, read-only */
	    {EIO, 0, KILN_UNSYNCED}, /* the sync failed */
	    {0, 1, KILN_UNSYNCED},   /* the directory cannot be opened */
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int rc[3], sys[3];
		publish_answers(cases[c].e, cases[c].refuse_open, rc, sys);
		for (int k = 0; k < 3; k++) {
			cr_assert_eq(rc[k], cases[c].want, "case %zu, writer %d: %s", c, k,
				     kiln_code_name(rc[k]));
			cr_assert_eq(sys[k], sys[0], "case %zu, writer %d", c, k);
		}
	}
}

/* A failure before the rename: IO naming the step, the old file intact, nothing left over. */
static void expect_untouched(const char *step, int sys_errno)
{
	char *path, *dir = dir_with("t.klnt", 1, &path);
	struct watch w = {.value = 2};
	kiln_error err;
	cr_assert_eq(write_u8(path, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, sys_errno, "%s", err.message);
	cr_assert_not_null(strstr(err.message, step), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "t.klnt"), "%s", err.message);
	cr_assert_eq(first_byte(path), 1, "the old file is intact");
	cr_assert_eq(entries(dir), 1, "a temporary file was left");
	free(path);
	drop_dir(dir);
}

Test(file, file_fsync_failure_leaves_target_untouched)
{
	kiln__sys.fsync = fsync_file_eio;
	expect_untouched("fsync", EIO);
	kiln__sys.openat = open_no_tmpfile;
	expect_untouched("fsync", EIO);
}

Test(file, rename_failure_leaves_target_untouched)
{
	kiln__sys.renameat = rename_eio;
	expect_untouched("rename", EIO); /* linked under a random name, then removed */
	kiln__sys.openat = open_no_tmpfile;
	expect_untouched("rename", EIO);
}

Test(file, link_failure_leaves_nothing)
{
	kiln__sys.linkat = link_enospc;
	expect_untouched("link", ENOSPC);
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/n.klnt", dir) > 0);
	struct watch w = {.value = 2};
	kiln_error err;
	int rc = write_u8(path, &w, 100, 0, &err);
	if (tmpfile_supported(dir)) {
		cr_assert_eq(rc, KILN_IO);
		cr_assert_eq(err.sys_errno, ENOSPC);
	}
	cr_assert_eq(entries(dir), rc ? 0 : 1);
	free(path);
	drop_dir(dir);
}

Test(file, callback_cancel_is_canceled)
{
	char *path, *dir = dir_with("c.klnt", 1, &path);
	struct watch w = {.value = 2, .fail_at = 2, .fail_with = ECANCELED};
	kiln_error err;
	cr_assert_eq(write_u8(path, &w, 3u << 20, 0, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(err.tensor, 0);
	cr_assert_eq(first_byte(path), 1);
	cr_assert_eq(entries(dir), 1);
	static uint8_t buf[1024];
	w = (struct watch){.fail_at = 1, .fail_with = ECANCELED};
	kiln_tensor_spec t = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {10}, .read = watch_read, .read_ctx = &w};
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), NULL, &err), KILN_CANCELED);
	free(path);
	drop_dir(dir);
}

Test(file, new_file_mode_follows_umask)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/m.klnt", dir) > 0);
	const mode_t masks[] = {022, 077, 002};
	for (int i = 0; i < 3; i++) {
		umask(masks[i]);
		struct watch w = {.value = 1};
		cr_assert_eq(write_u8(path, &w, 10, 0, NULL), 0);
		struct stat st;
		cr_assert_eq(stat(path, &st), 0);
		cr_assert_eq(st.st_mode & 07777, 0666 & ~masks[i], "mode %o", st.st_mode & 07777);
		unlink(path);
	}
	free(path);
	drop_dir(dir);
}

Test(file, rewrite_keeps_the_mode)
{
	umask(022);
	const mode_t modes[] = {0600, 0640, 0444, 02750};
	for (int fallback = 0; fallback < 2; fallback++) {
		if (fallback)
			kiln__sys.openat = open_no_tmpfile;
		for (int i = 0; i < 4; i++) {
			char *path, *dir = dir_with("p.klnt", 1, &path);
			cr_assert_eq(chmod(path, modes[i]), 0);
			struct watch w = {.value = 2};
			kiln_error err;
			cr_assert_eq(write_u8(path, &w, 100, 0, &err), 0, "%s", err.message);
			struct stat st;
			cr_assert_eq(stat(path, &st), 0);
			cr_assert_eq(st.st_mode & 07777, modes[i], "mode %o, want %o",
				     st.st_mode & 07777, modes[i]);
			cr_assert_eq(first_byte(path), 2);
			free(path);
			drop_dir(dir);
		}
	}
}

Test(file, rewrite_keeps_the_owner)
{
	if (geteuid() != 0)
		cr_skip_test("only root can give a file to someone else");
	char *path, *dir = dir_with("o.klnt", 1, &path);
	cr_assert_eq(chown(path, 4321, 4322), 0);
	cr_assert_eq(chmod(path, 0600), 0);
	struct watch w = {.value = 2};
	cr_assert_eq(write_u8(path, &w, 100, 0, NULL), 0);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_uid, 4321);
	cr_assert_eq(st.st_gid, 4322);
	cr_assert_eq(st.st_mode & 07777, 0600);
	free(path);
	drop_dir(dir);
}

static void expect_link(const char *link, const char *to)
{
	char buf[512];
	ssize_t n = readlink(link, buf, sizeof(buf) - 1);
	cr_assert_geq(n, 0, "%s is no longer a symlink", link);
	buf[n] = '\0';
	cr_assert_str_eq(buf, to);
}

Test(file, symlinks_are_followed_and_stay_links)
{
	char *real, *dir = dir_with("real.klnt", 1, &real);
	cr_assert_eq(chmod(real, 0600), 0);
	char *sub, *a, *b, *abs_link;
	cr_assert(asprintf(&sub, "%s/sub", dir) > 0);
	cr_assert_eq(mkdir(sub, 0700), 0);
	cr_assert(asprintf(&a, "%s/a", sub) > 0); /* sub/a -> b -> ../real.klnt */
	cr_assert(asprintf(&b, "%s/b", sub) > 0);
	cr_assert(asprintf(&abs_link, "%s/abs", dir) > 0);
	cr_assert_eq(symlink("b", a), 0);
	cr_assert_eq(symlink("../real.klnt", b), 0);
	cr_assert_eq(symlink(real, abs_link), 0);

	struct watch w = {.value = 2};
	kiln_error err;
	cr_assert_eq(write_u8(a, &w, 100, 0, &err), 0, "%s", err.message);
	expect_link(a, "b");
	expect_link(b, "../real.klnt");
	cr_assert_eq(first_byte(real), 2);
	struct stat st;
	cr_assert_eq(stat(real, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600, "the mode of the file behind the link is kept");
	cr_assert_eq(entries(sub), 2, "nothing was written next to the link");

	w.value = 3;
	cr_assert_eq(write_u8(abs_link, &w, 100, 0, &err), 0, "%s", err.message);
	expect_link(abs_link, real);
	cr_assert_eq(first_byte(real), 3);
	cr_assert_eq(entries(dir), 3);

	/* A dangling link names the file to create. */
	char *dangling, *created;
	cr_assert(asprintf(&dangling, "%s/dangling", dir) > 0);
	cr_assert(asprintf(&created, "%s/sub/created.klnt", dir) > 0);
	cr_assert_eq(symlink("sub/created.klnt", dangling), 0);
	w.value = 4;
	cr_assert_eq(write_u8(dangling, &w, 100, 0, &err), 0, "%s", err.message);
	expect_link(dangling, "sub/created.klnt");
	cr_assert_eq(first_byte(created), 4);

	/* A loop is IO, ELOOP. */
	char *l1, *l2;
	cr_assert(asprintf(&l1, "%s/l1", dir) > 0);
	cr_assert(asprintf(&l2, "%s/l2", dir) > 0);
	cr_assert_eq(symlink("l2", l1), 0);
	cr_assert_eq(symlink("l1", l2), 0);
	cr_assert_eq(write_u8(l1, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ELOOP);
	cr_assert_not_null(strstr(err.message, "symlink"), "%s", err.message);

	unlink(a);
	unlink(b);
	unlink(created);
	rmdir(sub);
	free(sub), free(a), free(b), free(abs_link), free(dangling), free(created), free(l1);
	free(l2), free(real);
	drop_dir(dir);
}

Test(file, a_stranger_s_symlink_in_a_sticky_directory_is_not_followed)
{
	if (geteuid() != 0)
		cr_skip_test("only root can make a symlink owned by someone else");
	char *real, *dir = dir_with("real.klnt", 1, &real);
	char *sticky, *link;
	cr_assert(asprintf(&sticky, "%s/tmp", dir) > 0);
	cr_assert(asprintf(&link, "%s/model.klnt", sticky) > 0);
	cr_assert_eq(mkdir(sticky, 0700), 0);
	cr_assert_eq(chmod(sticky, 01777), 0);
	cr_assert_eq(symlink(real, link), 0);
	cr_assert_eq(lchown(link, 4321, 4321), 0);
	struct watch w = {.value = 2};
	kiln_error err;
	cr_assert_eq(write_u8(link, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EACCES);
	cr_assert_eq(first_byte(real), 1, "the file behind the link was replaced");
	/* Our own link there, or anyone's in a directory that is not sticky, is followed. */
	cr_assert_eq(lchown(link, 0, 0), 0);
	cr_assert_eq(write_u8(link, &w, 100, 0, &err), 0, "%s", err.message);
	cr_assert_eq(first_byte(real), 2);
	cr_assert_eq(lchown(link, 4321, 4321), 0);
	cr_assert_eq(chmod(sticky, 0777), 0);
	w.value = 3;
	cr_assert_eq(write_u8(link, &w, 100, 0, &err), 0, "%s", err.message);
	cr_assert_eq(first_byte(real), 3);
	unlink(link);
	rmdir(sticky);
	free(link), free(sticky), free(real);
	drop_dir(dir);
}

Test(file, only_regular_files_are_replaced)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/x", dir) > 0);
	struct watch w = {.value = 2};
	kiln_error err;
	cr_assert_eq(mkdir(path, 0700), 0);
	cr_assert_eq(write_u8(path, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EISDIR);
	cr_assert_eq(rmdir(path), 0);
	cr_assert_eq(mkfifo(path, 0600), 0);
	cr_assert_eq(write_u8(path, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EINVAL);
	cr_assert_not_null(strstr(err.message, "regular"), "%s", err.message);
	struct stat st;
	cr_assert_eq(lstat(path, &st), 0);
	cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced");
	cr_assert_eq(entries(dir), 1);
	char *slash;
	cr_assert(asprintf(&slash, "%s/", dir) > 0);
	cr_assert_eq(write_u8(slash, &w, 100, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EISDIR);
	free(slash);
	free(path);
	drop_dir(dir);
}

Test(memory, size_matches_and_is_deterministic)
{
	kiln_tensor_spec t[2] = {
	    {.name = "x",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	    {.name = "y",
	     .name_len = 1,
	     .dtype = KILN_DT_BOOL,
	     .rank = 2,
	     .shape = {3, 1},
	     .data = "\1\0\1"},
	};
	blob a = build(t, 2), b = build(t, 2);
	cr_assert_eq(a.len, b.len);
	cr_assert_eq(memcmp(a.p, b.p, a.len), 0);
	/* header, 2 descriptors, heap "xy", pad to 384; x at 0 (8 bytes), y at 64 (3 bytes) */
	cr_assert_eq(a.len, 384 + 64 + 3);
	blob_free(&a);
	blob_free(&b);
}

/* kiln_write_atomic: any bytes, the same atomic publication as kiln_write_file. */
struct fill_spec {
	size_t len;  /* bytes to write, in two steps (write, then pwrite of the tail) */
	int fail;    /* return this code after writing half, with *err filled */
	int silent;  /* ... without filling *err */
	int seen_fd; /* the descriptor the fill got */
};

static int fill_bytes(void *ctx, int fd, kiln_error *err)
{
	struct fill_spec *f = ctx;
	f->seen_fd = fd;
	uint8_t buf[4096];
	size_t half = f->len / 2;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 7 + 3);
	for (size_t done = 0; done < half;) {
		size_t step = half - done < sizeof(buf) ? half - done : sizeof(buf);
		cr_assert_eq(write(fd, buf, step), (ssize_t)step);
		done += step;
	}
	if (f->fail)
		return f->silent ? f->fail
				 : kiln_error_set(err, f->fail, 0, "the fill stopped at %zu", half);
	for (size_t done = half; done < f->len;) {
		size_t step = f->len - done < sizeof(buf) ? f->len - done : sizeof(buf);
		cr_assert_eq(pwrite(fd, buf, step, (off_t)done), (ssize_t)step);
		done += step;
	}
	return 0;
}

static void expect_bytes(const char *path, size_t len)
{
	FILE *fp = fopen(path, "rb");
	cr_assert(fp, "%s is missing", path);
	size_t i = 0;
	for (int c; (c = fgetc(fp)) != EOF; i++) {
		size_t at = i < len / 2 ? i : i - len / 2;
		cr_assert_eq(c, (uint8_t)((at % 4096) * 7 + 3), "byte %zu", i);
	}
	fclose(fp);
	cr_assert_eq(i, len);
}

Test(atomic, a_fill_lands_whole_and_replaces_the_target)
{
	char *path, *dir = dir_with("a.bin", 1, &path);
	cr_assert_eq(chmod(path, 0640), 0);
	struct fill_spec f = {.len = 10000};
	kiln_error err;
	cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, 0, &err), 0, "%s", err.message);
	cr_assert_eq(err.code, KILN_OK);
	expect_bytes(path, f.len);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0640, "the mode of the replaced file is kept");
	cr_assert_eq(fcntl(f.seen_fd, F_GETFD), -1, "the fill's descriptor was closed");
	cr_assert_eq(entries(dir), 1);
	f = (struct fill_spec){.len = 0};
	cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, KILN_WRITE_NO_SYNC, &err), 0);
	expect_bytes(path, 0);
	free(path);
	drop_dir(dir);
}

Test(atomic, a_failing_fill_leaves_nothing)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/new.bin", dir) > 0);
	const int codes[] = {KILN_CANCELED, KILN_TYPE, KILN_IO};
	for (int i = 0; i < 3; i++) {
		struct fill_spec f = {.len = 3u << 20, .fail = codes[i]};
		kiln_error err;
		cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, 0, &err), codes[i]);
		cr_assert_eq(err.code, codes[i]);
		cr_assert(strstr(err.message, "the fill stopped"), "%s", err.message);
		cr_assert_eq(entries(dir), 0, "a new target or a temporary file was left");
		/* without O_TMPFILE the fill writes a named temporary file: removed too */
		kiln__sys.openat = open_no_tmpfile;
		cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, 0, &err), codes[i]);
		kiln__sys = kiln__sys_default;
		cr_assert_eq(entries(dir), 0, "the named temporary file was left");
	}
	/* a fill that fails without a word still gets one, and the old file stays */
	free(path);
	drop_dir(dir);
	dir = dir_with("old.klnt", 5, &path);
	struct fill_spec f = {.len = 100, .fail = KILN_CANCELED, .silent = 1};
	kiln_error err;
	cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, 0, &err), KILN_CANCELED);
	cr_assert(strstr(err.message, "fill"), "%s", err.message);
	f.fail = -1;
	cr_assert_eq(kiln_write_atomic(path, fill_bytes, &f, 0, &err), KILN_IO);
	cr_assert_eq(first_byte(path), 5);
	cr_assert_eq(entries(dir), 1);
	free(path);
	drop_dir(dir);
}

Test(atomic, bad_arguments_are_inval)
{
	kiln_error err;
	struct fill_spec f = {.len = 1};
	cr_assert_eq(kiln_write_atomic(NULL, fill_bytes, &f, 0, &err), KILN_INVAL);
	cr_assert_eq(kiln_write_atomic("x", NULL, &f, 0, &err), KILN_INVAL);
	cr_assert_eq(kiln_write_atomic("x", fill_bytes, &f, 4, &err), KILN_INVAL);
	cr_assert_eq(access("x", F_OK), -1);
}
