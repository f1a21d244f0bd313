/* SPDX-License-Identifier: MIT */
/* klnt check: certify models of any format (the structural pass and, for KLNT, payload
 * verification), optionally reading every byte to find unreadable sectors. */
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
    "Validate each FILE by the rules of its format (KLNT v2, safetensors or GGUF, told from its\n"
    "first bytes). KLNT: header, descriptors, name heap and pad, then payload verification: the\n"
    "bytes between payloads and the unused high nibble of odd-count 4-bit tensors must be zero.\n"
    "Verification reads only those bytes; no format has a checksum, so the other payload bytes\n"
    "have nothing to be checked against and are not read. safetensors: the header length, the\n"
    "JSON header, dtypes, shapes and offsets tiling the data exactly; GGUF: the header, the\n"
    "key/values and the tensor infos (docs/formats.md has every rule).\n"
    "A FILE named like a shard of a series (STEM-NNNNN-of-MMMMM.EXT: .klnt, .safetensors,\n"
    "split .gguf) checks the whole series: every shard, that none is missing, and that no name\n"
    "is in two shards; a model.safetensors.index.json checks the shards it names, and that\n"
    "each tensor is where the index says.\n"
    "\n"
    "With --read-all, every byte of each file is read as well (header, directory, gaps and\n"
    "payloads), with O_DIRECT where the file system allows it so the disk is read rather than\n"
    "the page cache: this finds unreadable sectors. Progress (bytes done of the total, rate)\n"
    "goes to stderr when it is a terminal.\n"
    "\n"
    "Prints one line per file on stdout:\n"
    "  FILE: ok                a KLNT file\n"
    "  FILE: ok (gguf)         a file of another format, named\n"
    "  FILE: ok (N bytes read, O_DIRECT)   with --read-all; \"buffered\" instead of O_DIRECT\n"
    "                         when the file system refused direct reads\n"
    "  FILE: ok (S shards, T tensors[, ...])   for a series\n"
    "  FILE: CLASS: message   CLASS is FRAME, TYPE, LIMIT or UTF8 for a rejected file (the\n"
    "                         message names its format's defect and where it is), IO when the\n"
    "                         file could not be opened or read (with --read-all, the message\n"
    "                         names the offset of the read that failed)\n"
    "\n"
    "Options:\n"
    "  -a, --read-all  read every byte of each file (see above)\n"
    "  -q, --quiet     print only the lines of files that are not ok\n"
    "  -h, --help      show this help and exit\n"
    "\n"
    "Exit status: 0 every file is valid; 1 a file was rejected and every file could be read;\n"
    "2 usage error; 3 a file could not be opened or read.\n";

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

/* Read every byte of the open model; on success say how many were read, and how. */
static int read_all(kiln_model *m, const char *path, kiln_stream_result *res, kiln_error *err)
{
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	double t0 = kmeasure_now();
	struct progress p = {.path = path,
			     .total = info.bytes,
			     .start = t0,
			     .shown = t0, /* the first line after a quarter second, not at once */
			     .tty = isatty(STDERR_FILENO)};
	kiln_stream_options o = {
	    .size = sizeof(o), .flags = KILN_STREAM_DIRECT, .on_chunk = on_chunk, .ctx = &p};
	int rc = kiln_model_read_all(m, &o, res, err);
	if (p.width)
		fprintf(stderr, "\r%*s\r", (int)p.width, "");
	klnt_buf_free(&p.line);
	return rc;
}

/* Check one file, or every shard of the series it belongs to (and the set's own rules: every
 * shard there, no name in two); returns 0 or the kiln code reported. */
static int check(const char *path, int all, int quiet)
{
	kiln_model *m;
	kiln_error err;
	kiln_stream_result res = {0};
	/* Verification first: it is cheap, and a rejected file is not worth reading whole. */
	kiln_open_options opts = {
	    .size = sizeof(opts), .flags = KILN_OPEN_VERIFY_PAYLOAD, .remote = klnt_remote()};
	int rc = kiln_model_open(path, &opts, &m, &err);
	if (!rc)
		klnt_note_cache(m);
	uint32_t shards = kiln_model_files(m);
	if (!rc && all)
		rc = read_all(m, path, &res, &err);
	uint64_t bytes = res.bytes, tensors = kiln_model_count(m);
	int direct = res.direct != 0;
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	unsigned format = info.format;
	kiln_model_close(m);
	if (rc) {
		klnt_report(stdout, path, rc, &err);
		return rc;
	}
	if (quiet)
		return 0;
	klnt_fputs_path(stdout, path);
	struct klnt_buf what = {0};
	if (format != KILN_FORMAT_KLNT)
		klnt_buf_puts(&what, kiln_format_name(format));
	if (shards > 1)
		klnt_buf_printf(&what, "%s%" PRIu32 " shards, %" PRIu64 " tensors",
				what.len ? ", " : "", shards, tensors);
	if (all)
		klnt_buf_printf(&what, "%s%" PRIu64 " bytes read, %s", what.len ? ", " : "", bytes,
				direct ? "O_DIRECT" : "buffered");
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
    .summary = "validate models (KLNT, safetensors, GGUF); --read-all reads every byte",
    .usage = usage,
    .run = run,
};
