/* SPDX-License-Identifier: MIT */
/*
 * Replay of the fuzz corpus without libFuzzer: every file of fuzz/corpus/<target>/, of
 * fuzz/large/<target>/ (seeds too large to mutate quickly, such as a header past the 64 KiB kiln
 * reads first, kept out of libFuzzer's corpus) and of tests/regressions/<target>/ (the
 * reproducers of crashes) goes through the same target function libFuzzer runs
 * (fuzz/fuzz_<target>.c), so every build, gcc included, checks them. A broken invariant aborts;
 * the handler below names the file first.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "helpers.h"
#include "kiln/kiln.h"

static char current[1024];

static void name_the_file(int sig)
{
	static const char msg[] = "crashed while replaying ";
	(void)!write(2, msg, sizeof(msg) - 1);
	(void)!write(2, current, strlen(current));
	(void)!write(2, "\n", 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every regular file in dir through fn; returns how many ran (0 when dir is missing). */
static size_t replay_dir(const char *dir, int (*fn)(const uint8_t *, size_t))
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	char **names = NULL;
	size_t n = 0, cap = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md"))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 256;
			names = realloc(names, cap * sizeof(*names));
			cr_assert_not_null(names);
		}
		names[n++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof(*names), by_name); /* a stable order for a failing run */
	signal(SIGABRT, name_the_file);
	signal(SIGSEGV, name_the_file);
	signal(SIGBUS, name_the_file);
	for (size_t i = 0; i < n; i++) {
		snprintf(current, sizeof(current), "%s/%s", dir, names[i]);
		FILE *f = fopen(current, "rb");
		cr_assert_not_null(f, "cannot open %s", current);
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		rewind(f);
		cr_assert_geq(len, 0);
		/* An exact-size copy, as libFuzzer gives it, so a read past the end is caught. */
		uint8_t *buf = malloc(len ? (size_t)len : 1);
		cr_assert_not_null(buf);
		cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
		fclose(f);
		cr_assert_eq(fn(buf, (size_t)len), 0, "%s", current);
		free(buf);
		free(names[i]);
	}
	free(names);
	return n;
}

static void replay(const char *target, int (*fn)(const uint8_t *, size_t))
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/%s", KILN_FUZZ_CORPUS, target);
	size_t corpus = replay_dir(dir, fn);
	cr_assert_gt(corpus, 0, "no corpus in %s", dir);
	snprintf(dir, sizeof(dir), "%s/%s", KILN_FUZZ_LARGE, target);
	size_t large = replay_dir(dir, fn);
	snprintf(dir, sizeof(dir), "%s/%s", KILN_REGRESSIONS, target);
	size_t regressions = replay_dir(dir, fn);
	cr_log_info("%s: %zu corpus files, %zu large, %zu regressions", target, corpus, large,
		    regressions);
}

Test(replay, parse)
{
	replay("parse", kiln_fuzz_parse);
}

Test(replay, roundtrip)
{
	replay("roundtrip", kiln_fuzz_roundtrip);
}

Test(replay, lookup)
{
	replay("lookup", kiln_fuzz_lookup);
}

Test(replay, safetensors)
{
	replay("safetensors", kiln_fuzz_safetensors);
}

Test(replay, gguf)
{
	replay("gguf", kiln_fuzz_gguf);
}

Test(replay, http)
{
	replay("http", kiln_fuzz_http);
}

Test(replay, s3error)
{
	replay("s3error", kiln_fuzz_s3error);
}

Test(replay, awsconfig)
{
	replay("awsconfig", kiln_fuzz_awsconfig);
}

Test(replay, index)
{
	replay("index", kiln_fuzz_index);
}

Test(replay, cache)
{
	replay("cache", kiln_fuzz_cache);
}

Test(replay, digest)
{
	replay("digest", kiln_fuzz_digest);
}

Test(replay, signing)
{
	replay("signing", kiln_fuzz_signing);
}

/* The same verdict from a file as from the buffer: every parse input is written to a file and
 * opened mapped (the page cache warm: the directory in one read), mapped again after eviction
 * (windows of descriptors with read-ahead hints) and read into owned memory; the error's class,
 * descriptor, field and offset must be the buffer's. The file paths fetch the directory in
 * pieces that the buffer parse never has, so this is where a fetch that reads too little or too
 * much shows. */
static int same_as_buffer(const uint8_t *buf, size_t len)
{
	kiln_error want, got;
	int rc = kiln_validate(buf, len, 0, &want);
	char *path = write_temp(buf, len);
	for (int way = 0; way < 3; way++) {
		if (way == 1) {
			int fd = open(path, O_RDONLY);
			cr_assert(fd >= 0);
			cr_assert_eq(fdatasync(fd), 0);
			cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
			close(fd);
		}
		kiln_open_options o = {.source = way == 2 ? KILN_SOURCE_READ : KILN_SOURCE_MMAP};
		kiln_model *dir;
		int frc = kiln_model_open(path, &o, &dir, &got);
		kiln_model_close(dir);
		static const char *const ways[] = {"mapped, warm", "mapped, cold", "read"};
		cr_assert_eq(frc, rc, "%s (%s): file %s, buffer %s (%s)", current, ways[way],
			     kiln_code_name(frc), kiln_code_name(rc), rc ? want.message : "");
		if (!rc)
			continue;
		cr_assert_eq(got.tensor, want.tensor, "%s (%s): %s | %s", current, ways[way],
			     got.message, want.message);
		cr_assert_eq(got.offset, want.offset, "%s (%s): %s | %s", current, ways[way],
			     got.message, want.message);
		cr_assert_eq(got.file, want.file, "%s (%s): file %u, buffer file %u", current,
			     ways[way], got.file, want.file);
		cr_assert((!got.field && !want.field) ||
			      (got.field && want.field && !strcmp(got.field, want.field)),
			  "%s (%s): %s | %s", current, ways[way], got.message, want.message);
	}
	unlink(path);
	free(path);
	return 0;
}

Test(replay, parse_inputs_as_files)
{
	replay("parse", same_as_buffer);
}
