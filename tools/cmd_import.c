/* SPDX-License-Identifier: MIT */
/*
 * klnt import: GGUF or safetensors checkpoints into a KLNT file or shard series, through
 * kiln_import() (convert/). Also the progress line and error reporting klnt export shares.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/convert.h"
#include "klnt.h"

static const char usage[] =
    "usage: klnt import -o OUT [--max-shard-size SIZE] [--no-sync] [--no-digests] SRC...\n"
    "\n"
    "Convert a model to KLNT v2, losslessly: tensors keep their bytes, and the source's\n"
    "metadata is kept as a JSON document in the tensor \"kiln.metadata\" (see klnt inspect).\n"
    "SRC is a GGUF file (a split model's first part finds the other parts; passing every\n"
    "part works too), or safetensors files, or a model.safetensors.index.json. The format is\n"
    "recognized from the first bytes.\n"
    "\n"
    "OUT is written when everything fits one file. When the names do not fit one file's\n"
    "name heap (about 64 KiB of names), or --max-shard-size asks for smaller files, a shard\n"
    "series STEM-00001-of-0000N.klnt is written next to OUT instead (STEM is OUT without\n"
    ".klnt): every shard a valid file on its own. The files written are printed on stdout.\n"
    "What an earlier import to OUT wrote in another form (a series of another count, or OUT\n"
    "itself when a series is written now, or a series when OUT is) is removed once the new\n"
    "files are in place: only valid KLNT files of those names, never a SRC.\n"
    "On a terminal, progress is shown on stderr. SIGINT or SIGTERM stop the import; like\n"
    "any failure, that leaves no output file and no temporary file.\n"
    "\n"
    "Options:\n"
    "  -o, --output OUT         the KLNT file to write\n"
    "      --max-shard-size SIZE\n"
    "                           the most payload bytes per file (K, M, G suffixes: powers\n"
    "                           of 1024); a larger tensor gets a file of its own\n"
    "      --no-sync            do not fsync the files written (faster; a crash may lose\n"
    "                           or tear them)\n"
    "      --no-digests         write the tensors alone, without each file's digest table\n"
    "                           (its last tensor, kiln.digests; docs/integrity.md)\n"
    "  -h, --help               show this help and exit\n"
    "\n"
    "Exit status: 0 ok; 1 a source was rejected (FRAME, TYPE, LIMIT, UTF8: not a GGUF or\n"
    "safetensors file, or a malformed one; INVAL, UNSUPPORTED: one this build cannot take);\n"
    "2 usage error; 3 a file could not be read or written (IO), or memory ran out;\n"
    "130, 143 interrupted by SIGINT, SIGTERM.\n";

/* How long the progress line waits between updates, and the line itself. */
static void show(struct klnt_progress *p, uint64_t done, uint64_t total)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!p->shown)
		p->start = now;
	double since =
	    (double)(now.tv_sec - p->last.tv_sec) + (double)(now.tv_nsec - p->last.tv_nsec) / 1e9;
	if (p->shown && since < 0.25 && done < total)
		return;
	double elapsed =
	    (double)(now.tv_sec - p->start.tv_sec) + (double)(now.tv_nsec - p->start.tv_nsec) / 1e9;
	p->last = now;
	p->shown = 1;
	fprintf(stderr, "\rklnt %s: %" PRIu64 " of %" PRIu64 " MiB (%d%%)", p->cmd->name,
		done >> 20, total >> 20, total ? (int)(100.0 * (double)done / (double)total) : 100);
	if (elapsed > 0.05)
		fprintf(stderr, ", %.0f MiB/s", (double)done / elapsed / 1048576.0);
	fputs("   ", stderr);
}

int klnt_convert_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct klnt_progress *p = ctx;
	/* Stopping here makes the converter remove what it wrote and return CANCELED. */
	if (klnt_caught_signal())
		return 1;
	if (p->tty)
		show(p, done, total);
	return 0;
}

int klnt_convert_finish(struct klnt_progress *p, const char *out, const char *const *files,
			int nfiles, int rc, const kiln_error *err)
{
	if (p->shown)
		fprintf(stderr, "\r%70s\r", "");
	int sig = klnt_caught_signal();
	if (sig && (rc == KILN_CANCELED || rc == KILN_OK || rc == KILN_UNSYNCED))
		return klnt_interrupted(p->cmd, out, sig, rc != KILN_CANCELED);
	if (!rc)
		return KLNT_EXIT_OK;
	/* "FILE: CLASS: message" with the file the message is about: a source (named in the
	 * message, or the one source when the error is about an input file), or OUT. */
	const char *file = out;
	if (err->file != KILN_NO_FILE && nfiles == 1)
		file = files[0];
	for (int i = 0; i < nfiles; i++) {
		size_t len = strlen(files[i]);
		if (!strncmp(err->message, files[i], len) && err->message[len] == ':')
			file = files[i];
	}
	klnt_report(stderr, file, rc, err);
	return klnt_exit_for(rc);
}

/* "wrote OUT: ..." or, for a series, the first and last file. */
static void print_written(const kiln_convert_result *r)
{
	struct klnt_buf b = {0};
	klnt_buf_puts(&b, "wrote ");
	klnt_escape(&b, r->first, strlen(r->first), 0);
	size_t len = strlen(r->first);
	const char *tail = "-00001-of-";
	if (r->files > 1 && len > 20 && !strncmp(r->first + len - 20, tail, strlen(tail))) {
		klnt_buf_puts(&b, " .. ");
		char last[sizeof(r->first)];
		snprintf(last, sizeof(last), "%s", r->first);
		char idx[6];
		snprintf(idx, sizeof(idx), "%05" PRIu32, r->files % 100000);
		memcpy(last + len - 19, idx, 5);
		klnt_escape(&b, last, len, 0);
		klnt_buf_printf(&b, " (%" PRIu32 " files)", r->files);
	}
	klnt_buf_printf(&b, ": %" PRIu32 " tensors, %" PRIu64 " payload bytes\n", r->tensors,
			r->bytes);
	if (r->removed)
		klnt_buf_printf(&b, "removed %" PRIu32 " file%s of an earlier import to OUT\n",
				r->removed, r->removed == 1 ? "" : "s");
	fputs(b.p, stdout);
	klnt_buf_free(&b);
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	enum { OPT_MAX_SHARD = 256, OPT_NO_SYNC, OPT_NO_DIGESTS };
	static const struct option longopts[] = {
	    {"output", required_argument, NULL, 'o'},
	    {"max-shard-size", required_argument, NULL, OPT_MAX_SHARD},
	    {"no-sync", no_argument, NULL, OPT_NO_SYNC},
	    {"no-digests", no_argument, NULL, OPT_NO_DIGESTS},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *out = NULL;
	uint64_t max_shard = 0, wflags = 0;
	int c;
	while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case OPT_MAX_SHARD:
			if (klnt_parse_size(optarg, &max_shard) || max_shard == 0)
				return klnt_usage_error(cmd,
							"--max-shard-size '%s' is not a size above "
							"0 (like 512M or 2G)",
							optarg);
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
	if (!out)
		return klnt_usage_error(cmd, "no output file: give -o OUT");
	if (optind >= argc)
		return klnt_usage_error(cmd, "no source files given");
	if (argc - optind > 100000)
		return klnt_usage_error(cmd, "more than 100000 source files");
	const char *const *srcs = (const char *const *)argv + optind;
	int n = argc - optind;

	struct klnt_progress p = {.cmd = cmd, .tty = isatty(STDERR_FILENO)};
	kiln_convert_options o = {.size = sizeof(o),
				  .max_shard_size = max_shard,
				  .write_flags = wflags,
				  .progress = klnt_convert_progress,
				  .ctx = &p};
	kiln_convert_result r;
	kiln_error err;
	klnt_catch_signals();
	int rc = kiln_import(srcs, (uint32_t)n, out, &o, &r, &err);
	rc = klnt_convert_finish(&p, out, srcs, n, rc, &err);
	if (rc == KLNT_EXIT_OK)
		print_written(&r);
	return rc;
}

const struct klnt_cmd klnt_cmd_import = {
    .name = "import",
    .summary = "convert GGUF or safetensors files into a KLNT file",
    .usage = usage,
    .run = run,
};
