/* SPDX-License-Identifier: MIT */
/* klnt export: a KLNT file or shard series back to GGUF or safetensors, through kiln_export(). */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "kiln/convert.h"
#include "klnt.h"

static const char usage[] =
    "usage: klnt export --to gguf|safetensors -o OUT [--no-sync] [--no-digests] FILE...\n"
    "\n"
    "Convert a KLNT file, or the shards of a series in order, to one GGUF or safetensors\n"
    "file OUT, restoring the metadata kept by klnt import: GGUF keys with their value types,\n"
    "ggml types from the opaque layouts, safetensors dtypes and __metadata__. A tensor the\n"
    "target cannot express (a GGUF block type in safetensors, an e2m1 tensor in GGUF) is an\n"
    "error naming it. OUT is replaced atomically; on a terminal, progress is shown on stderr;\n"
    "SIGINT, SIGTERM or any failure leave no output and no temporary file.\n"
    "\n"
    "Options:\n"
    "  -t, --to FORMAT   gguf or safetensors (required)\n"
    "  -o, --output OUT  the file to write\n"
    "      --no-sync     do not fsync OUT (faster; a crash may lose or tear it)\n"
    "      --no-digests  write OUT without its digest table (by default kept in its\n"
    "                    key/values or __metadata__ as kiln.digests; docs/integrity.md)\n"
    "  -h, --help        show this help and exit\n"
    "\n"
    "Exit status: 0 ok; 1 a FILE was rejected (FRAME, TYPE, LIMIT, UTF8: malformed; INVAL:\n"
    "a tensor cannot be expressed in FORMAT; UNSUPPORTED: one this build cannot take);\n"
    "2 usage error; 3 a file could not be read or written (IO), or memory ran out;\n"
    "130, 143 interrupted by SIGINT, SIGTERM.\n";

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	enum { OPT_NO_SYNC = 256, OPT_NO_DIGESTS };
	static const struct option longopts[] = {
	    {"to", required_argument, NULL, 't'},
	    {"no-sync", no_argument, NULL, OPT_NO_SYNC},
	    {"no-digests", no_argument, NULL, OPT_NO_DIGESTS},
	    {"output", required_argument, NULL, 'o'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *out = NULL;
	uint32_t format = 0;
	uint64_t wflags = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":t:o:h", longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (!strcmp(optarg, "gguf"))
				format = KILN_FORMAT_GGUF;
			else if (!strcmp(optarg, "safetensors"))
				format = KILN_FORMAT_SAFETENSORS;
			else
				return klnt_usage_error(
				    cmd, "--to '%s': the format is gguf or safetensors", optarg);
			break;
		case 'o':
			out = optarg;
			break;
		case OPT_NO_SYNC:
			wflags |= KILN_WRITE_NO_SYNC;
			break;
		case OPT_NO_DIGESTS:
			wflags |= KILN_WRITE_NO_DIGESTS;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (!format)
		return klnt_usage_error(cmd,
					"no target format: give --to gguf or --to safetensors");
	if (!out)
		return klnt_usage_error(cmd, "no output file: give -o OUT");
	if (optind >= argc)
		return klnt_usage_error(cmd, "no KLNT files given");
	if (argc - optind > 100000)
		return klnt_usage_error(cmd, "more than 100000 files");
	const char *const *files = (const char *const *)argv + optind;
	int n = argc - optind;

	struct klnt_progress p = {.cmd = cmd, .tty = isatty(STDERR_FILENO)};
	kiln_convert_options o = {.size = sizeof(o),
				  .format = format,
				  .write_flags = wflags,
				  .progress = klnt_convert_progress,
				  .ctx = &p};
	kiln_convert_result r;
	kiln_error err;
	klnt_catch_signals();
	int rc = kiln_export(files, (uint32_t)n, out, &o, &r, &err);
	rc = klnt_convert_finish(&p, out, files, n, rc, &err);
	if (rc == KLNT_EXIT_OK) {
		struct klnt_buf b = {0};
		klnt_buf_puts(&b, "wrote ");
		klnt_escape(&b, r.first, strlen(r.first), 0);
		klnt_buf_printf(&b, ": %" PRIu32 " tensors, %" PRIu64 " payload bytes\n", r.tensors,
				r.bytes);
		fputs(b.p, stdout);
		klnt_buf_free(&b);
	}
	return rc;
}

const struct klnt_cmd klnt_cmd_export = {
    .name = "export",
    .summary = "convert KLNT files to GGUF or safetensors",
    .usage = usage,
    .run = run,
};
