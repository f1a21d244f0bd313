#define _GNU_SOURCE
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"

static char *made[64];
static int nmade;

static void cleanup(void)
{
	for (int i = 0; i < nmade; i++) {
		unlink(made[i]);
		free(made[i]);
	}
	const char *dir = getenv("KILN_BENCH_DIR");
	rmdir(dir ? dir : "bench-files");
}

static void die(const char *what, const kiln_error *err)
{
	fprintf(stderr, "bench: %s: %s\n", what, err ? err->message : "failed");
	exit(1);
}

static int zero_fill(void *ctx, uint32_t t, uint64_t off, void *buf, size_t len)
{
	(void)ctx;
	(void)t;
	(void)off;
	memset(buf, 0, len);
	return 0;
}

static void put_le64(FILE *f, uint64_t at, uint64_t v)
{
	uint8_t le[8];
	for (int k = 0; k < 8; k++)
		le[k] = (uint8_t)(v >> (8 * k));
	if (fseek(f, (long)at, SEEK_SET) != 0 || fwrite(le, 1, 8, f) != 8)
		die("patching a benchmark file", NULL);
}

char *kbu_tensors_file(uint32_t count, uint64_t payload, uint64_t sparse_total, int named)
{
	const char *dir = getenv("KILN_BENCH_DIR");
	if (!dir)
		dir = "bench-files";
	mkdir(dir, 0777);
	char *path;
	if (asprintf(&path, "%s/open-%u-%d-%llu-%llu-%ld.klnt", dir, count, named,
		     (unsigned long long)payload, (unsigned long long)sparse_total,
		     (long)getpid()) < 0)
		die("asprintf", NULL);
	kiln_tensor_spec *t = calloc(count, sizeof(*t));
	char *names = malloc((size_t)count * 24);
	if (!t || !names)
		die("out of memory", NULL);
	uint64_t each = payload / count;
	for (uint32_t i = 0; i < count; i++) {
		char *n = names + (size_t)i * 24;
		int len = snprintf(n, 24, "blk.%u.w", i);
		t[i] = (kiln_tensor_spec){.name = named ? n : NULL,
					  .name_len = named ? (size_t)len : 0,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {each},
					  .read = zero_fill};
	}
	kiln_error err;
	if (kiln_write_file(path, t, count, KILN_WRITE_NO_SYNC, &err))
		die(path, &err);
	if (sparse_total) {
		/* Grow the last tensor in place (shape, byte_length, payload_bytes), then extend
		 * the file with a hole. Payload offsets are i * align64(each). */
		struct stat st;
		if (stat(path, &st) != 0)
			die(path, NULL);
		uint64_t last_off = (count - 1) * ((each + 63) / 64 * 64);
		uint64_t payload_base = (uint64_t)st.st_size - (last_off + each);
		uint64_t grown = sparse_total - last_off;
		uint64_t d = 64 + 128ull * (count - 1);
		FILE *f = fopen(path, "r+b");
		if (!f)
			die(path, NULL);
		put_le64(f, d + 40, grown);    /* byte_length */
		put_le64(f, d + 48, grown);    /* shape[0] */
		put_le64(f, 16, sparse_total); /* payload_bytes */
		fclose(f);
		if (truncate(path, (off_t)(payload_base + sparse_total)) != 0)
			die(path, NULL);
		kiln_dir *check;
		if (kiln_dir_open(path, NULL, &check, &err) != 0)
			die(path, &err);
		kiln_dir_close(check);
	}
	free(names);
	free(t);
	if (nmade == 0)
		atexit(cleanup);
	if (nmade == 64)
		die("too many benchmark files", NULL);
	made[nmade++] = path; /* owned here, freed at exit */
	return path;
}
