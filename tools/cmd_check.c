/* SPDX-License-Identifier: MIT */
/* klnt check: certify files (the structural pass and payload verification), optionally reading
 * every byte to find unreadable sectors, and naming the foreign formats people mistake for KLNT. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "klnt.h"
#include "measure.h"

static const char usage[] =
    "usage: klnt check [-q] [--read-all] FILE...\n"
    "\n"
    "Validate each FILE as a KLNT v2 block: header, descriptors, name heap and pad, then\n"
    "payload verification: the bytes between payloads and the unused high nibble of odd-count\n"
    "4-bit tensors must be zero. Verification reads only those bytes; the format has no\n"
    "checksum, so the other payload bytes have nothing to be checked against and are not read.\n"
    "A FILE named like a shard of a series (STEM-NNNNN-of-MMMMM.klnt) checks the whole series:\n"
    "every shard, that none is missing, and that no name is in two shards.\n"
    "\n"
    "With --read-all, every byte of each file is read as well (header, directory, gaps and\n"
    "payloads), with O_DIRECT where the file system allows it so the disk is read rather than\n"
    "the page cache: this finds unreadable sectors. Progress (bytes done of the total, rate)\n"
    "goes to stderr when it is a terminal.\n"
    "\n"
    "Prints one line per file on stdout:\n"
    "  FILE: ok\n"
    "  FILE: ok (N bytes read, O_DIRECT)   with --read-all; \"buffered\" instead of O_DIRECT\n"
    "                         when the file system refused direct reads\n"
    "  FILE: ok (S shards, T tensors[, ...])   for a series\n"
    "  FILE: CLASS: message   CLASS is FRAME, TYPE, LIMIT or UTF8 for a rejected file,\n"
    "                         IO when the file could not be opened or read (with --read-all,\n"
    "                         the message names the offset of the read that failed)\n"
    "A GGUF or safetensors file is named as such, with what to do about it.\n"
    "\n"
    "Options:\n"
    "  -a, --read-all  read every byte of each file (see above)\n"
    "  -q, --quiet     print only the lines of files that are not ok\n"
    "  -h, --help      show this help and exit\n"
    "\n"
    "Exit status: 0 every file is valid; 1 a file was rejected and every file could be read;\n"
    "2 usage error; 3 a file could not be opened or read.\n";

/* --- foreign formats ------------------------------------------------------------------------- */

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = v << 8 | p[k];
	return v;
}

/*
 * When kiln rejects a file at its magic, look at its first bytes for the formats people take for
 * KLNT: GGUF ("GGUF", then a u32 version) and safetensors (a u64 header length N, then a JSON
 * object of N bytes that fits in the file). Writes a description into what[0, cap) and returns 1
 * on a match. Reads at most 16 bytes; any values are only printed, never used as sizes.
 */
static int foreign_format(const char *path, char *what, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return 0;
	uint8_t b[16];
	struct stat st;
	ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, b, sizeof(b), 0) : -1;
	close(fd);
	if (n >= 4 && memcmp(b, "GGUF", 4) == 0) {
		if (n >= 8)
			snprintf(what, cap, "a GGUF file (version %" PRIu32 ")",
				 (uint32_t)(b[4] | b[5] << 8 | b[6] << 16 | (uint32_t)b[7] << 24));
		else
			snprintf(what, cap, "the start of a GGUF file");
		return 1;
	}
	if (n >= 9 && b[8] == '{') {
		uint64_t header = le64(b), size = (uint64_t)st.st_size;
		if (size >= 8 && header >= 2 && header <= size - 8) {
			snprintf(what, cap, "a safetensors file (a %" PRIu64 "-byte JSON header)",
				 header);
			return 1;
		}
	}
	return 0;
}

/* Report a rejected file: the usual line, or for a foreign format a line that says what it is. */
static void report(const char *path, int rc, const kiln_error *err)
{
	char what[96];
	if (rc == KILN_FRAME && err->field && strcmp(err->field, "magic") == 0 &&
	    foreign_format(path, what, sizeof(what))) {
		klnt_fputs_escaped(stdout, path);
		printf(": FRAME: not a KLNT v2 block: this is %s; convert it with "
		       "`klnt import -o OUT.klnt FILE` (safetensors shards: all of them, or their "
		       "model.safetensors.index.json)\n",
		       what);
		return;
	}
	klnt_report(stdout, path, rc, err);
}

/* --- reading every byte ---------------------------------------------------------------------- */

struct progress {
	const char *path;
	uint64_t total, done;
	double start, shown;
	int tty;
	struct klnt_buf line;
	size_t width; /* of the longest line shown, so clearing covers it */
};

static int on_chunk(void *ctx, const kiln_chunk *c)
{
	struct progress *p = ctx;
	p->done += c->length;
	double t = kmeasure_now();
	if (p->tty && t - p->shown >= 0.25) {
		p->shown = t;
		klnt_buf_reset(&p->line);
		klnt_buf_puts(&p->line, "klnt check: ");
		klnt_escape(&p->line, p->path, strlen(p->path), 0);
		klnt_buf_printf(&p->line, ": %.1f of %.1f MB, %.0f MB/s", (double)p->done / 1e6,
				(double)p->total / 1e6, (double)p->done / 1e6 / (t - p->start));
		size_t w = klnt_text_width(p->line.p, p->line.len);
		if (w > p->width)
			p->width = w;
		fprintf(stderr, "\r%s%*s", p->line.p, (int)(p->width - w), "");
	}
	return 0;
}

/* Read every byte of the open file; on success say how many were read, and how. */
static int read_all(kiln_dir *dir, const char *path, kiln_stream_result *res, kiln_error *err)
{
	kiln_dir_info info;
	kiln_dir_get_info(dir, &info);
	double t0 = kmeasure_now();
	struct progress p = {.path = path,
			     .total = info.block_length,
			     .start = t0,
			     .shown = t0, /* the first line after a quarter second, not at once */
			     .tty = isatty(STDERR_FILENO)};
	kiln_stream_options o = {
	    .size = sizeof(o), .flags = KILN_STREAM_DIRECT, .on_chunk = on_chunk, .ctx = &p};
	int rc = kiln_dir_read_all(dir, &o, res, err);
	if (p.width)
		fprintf(stderr, "\r%*s\r", (int)p.width, "");
	klnt_buf_free(&p.line);
	return rc;
}

/* Check one file, or every shard of the series it belongs to (and the set's own rules: every
 * shard there, no name in two); returns 0 or the kiln code reported. */
static int check(const char *path, int all, int quiet)
{
	kiln_set *set;
	kiln_error err;
	kiln_stream_result res = {0};
	uint64_t bytes = 0;
	int direct = 1;
	/* Verification first: it is cheap, and a rejected file is not worth reading whole. */
	kiln_open_options opts = {.size = sizeof(opts), .flags = KILN_OPEN_VERIFY_PAYLOAD};
	int rc = kiln_set_open((const char *const[]){path}, 1, &opts, &set, &err);
	uint32_t shards = kiln_set_shards(set);
	for (uint32_t s = 0; !rc && all && s < shards; s++) {
		rc = read_all(kiln_set_shard(set, s), kiln_set_path(set, s), &res, &err);
		bytes += res.bytes;
		direct &= res.direct != 0;
	}
	uint64_t tensors = kiln_set_count(set);
	kiln_set_close(set);
	if (rc) {
		report(path, rc, &err);
		return rc;
	}
	if (quiet)
		return 0;
	klnt_fputs_escaped(stdout, path);
	struct klnt_buf what = {0};
	if (shards > 1)
		klnt_buf_printf(&what, "%" PRIu32 " shards, %" PRIu64 " tensors", shards, tensors);
	if (all)
		klnt_buf_printf(&what, "%s%" PRIu64 " bytes read, %s", shards > 1 ? ", " : "",
				bytes, direct ? "O_DIRECT" : "buffered");
	if (what.len)
		printf(": ok (%s)\n", what.p);
	else
		fputs(": ok\n", stdout);
	klnt_buf_free(&what);
	return 0;
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"read-all", no_argument, NULL, 'a'},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int quiet = 0, all = 0, c;
	while ((c = getopt_long(argc, argv, ":aqh", longopts, NULL)) != -1) {
		switch (c) {
		case 'a':
			all = 1;
			break;
		case 'q':
			quiet = 1;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (optind >= argc)
		return klnt_usage_error(cmd, "no files given");

	int invalid = 0, io = 0;
	for (int i = optind; i < argc; i++) {
		int rc = check(argv[i], all, quiet);
		if (kiln_is_format_error(rc))
			invalid = 1;
		else if (rc)
			io = 1;
		/* Reading a large file takes a while; show each verdict as it comes rather than
		 * when the buffer fills. */
		klnt_flush_stdout();
	}
	return io ? KLNT_EXIT_IO : invalid ? KLNT_EXIT_INVALID : KLNT_EXIT_OK;
}

const struct klnt_cmd klnt_cmd_check = {
    .name = "check",
    .summary = "validate files: structure and payload padding; --read-all reads every byte",
    .usage = usage,
    .run = run,
};
