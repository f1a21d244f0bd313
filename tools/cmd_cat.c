/* SPDX-License-Identifier: MIT */
/* klnt cat: one tensor's payload bytes, exactly as stored, to stdout. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <string.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt cat [--name] [--source mmap|read|uring] [--direct] FILE TENSOR\n"
    "\n"
    "Write the raw payload bytes of one tensor of FILE to stdout: byte_length bytes, no\n"
    "header, no conversion. TENSOR is a name, or #INDEX (a '#' followed by decimal digits)\n"
    "for the descriptor index that 'klnt inspect' shows; unnamed tensors are only reachable\n"
    "by index, and so are names that contain U+0000. Only the structure of FILE is validated.\n"
    "\n"
    "Options:\n"
    "  -n, --name  take TENSOR as a name even if it looks like #INDEX (a tensor named \"#3\")\n"
    "  -s, --source SOURCE  how to load FILE: mmap (default: map it, read only the tensor),\n"
    "              read (the whole file into memory with pread) or uring (with io_uring)\n"
    "  -d, --direct  with read or uring, bypass the page cache (O_DIRECT); falls back to\n"
    "              buffered reads, with a note on stderr, where the file system refuses\n"
    "  -h, --help  show this help and exit\n"
    "\n"
    "Put '--' before a TENSOR name that starts with '-'.\n"
    "\n"
    "Exit status: 0 ok; 1 the file was rejected or has no such tensor; 2 usage error;\n"
    "3 the file could not be opened or read, or stdout could not be written.\n";

/* "#" and one or more digits; anything else ("#", "#x", "#-1") is a name. */
static int parse_index(const char *arg, uint64_t *index)
{
	return arg[0] == '#' && klnt_parse_u64(arg + 1, UINT64_MAX, index) == 0;
}

static void not_found(const char *path, const char *what, const kiln_dir *dir)
{
	klnt_fputs_escaped(stderr, path);
	fprintf(stderr, ": %s: no tensor %s", kiln_code_name(KILN_NOTFOUND), what);
	uint32_t n = kiln_dir_count(dir);
	kiln_dir_info info;
	kiln_dir_get_info(dir, &info);
	if (n == 1 && !(info.flags & KILN_FLAG_NAMES))
		fputs(" (its one tensor is unnamed; use #0)", stderr);
	else if (n && !(info.flags & KILN_FLAG_NAMES))
		fprintf(stderr, " (its tensors are unnamed; use #0..#%" PRIu32 ")", n - 1);
	else
		fprintf(stderr, " (the file has %" PRIu32 " tensor%s)", n, n == 1 ? "" : "s");
	fputc('\n', stderr);
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"name", no_argument, NULL, 'n'},
	    {"source", required_argument, NULL, 's'},
	    {"direct", no_argument, NULL, 'd'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int by_name = 0, c;
	kiln_open_options opts = {.size = sizeof(opts)};
	while ((c = getopt_long(argc, argv, ":ns:dh", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			by_name = 1;
			break;
		case 's':
			if (strcmp(optarg, "mmap") == 0)
				opts.source = KILN_SOURCE_MMAP;
			else if (strcmp(optarg, "read") == 0)
				opts.source = KILN_SOURCE_READ;
			else if (strcmp(optarg, "uring") == 0)
				opts.source = KILN_SOURCE_URING;
			else
				return klnt_usage_error(
				    cmd, "unknown source '%s' (mmap, read, uring)", optarg);
			break;
		case 'd':
			opts.flags |= KILN_OPEN_DIRECT;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (argc - optind < 2)
		return klnt_usage_error(cmd, optind < argc ? "no tensor given" : "no file given");
	if ((opts.flags & KILN_OPEN_DIRECT) && opts.source == KILN_SOURCE_MMAP)
		return klnt_usage_error(cmd, "--direct needs --source read or uring");
	if (argc - optind > 2)
		return klnt_usage_error(cmd, "one tensor at a time; '%s' is extra",
					argv[optind + 2]);
	const char *path = argv[optind], *want = argv[optind + 1];

	kiln_error err;
	kiln_dir *dir;
	int rc = kiln_dir_open(path, &opts, &dir, &err);
	if (rc) {
		klnt_report(stderr, path, rc, &err);
		return klnt_exit_for(rc);
	}
	kiln_dir_info info;
	kiln_dir_get_info(dir, &info);
	if (info.direct_fallback || info.uring_fallback) {
		/* The bytes are the same either way; say why the requested path was not taken. */
		klnt_fputs_escaped(stderr, path);
		if (info.direct_fallback)
			fprintf(stderr, ": note: O_DIRECT unavailable (%s), read buffered\n",
				strerror(info.direct_fallback));
		if (info.uring_fallback)
			fprintf(stderr, ": note: io_uring unavailable (%s), read with pread\n",
				strerror(info.uring_fallback));
	}

	const kiln_tensor *t;
	uint64_t index;
	struct klnt_buf what = {0};
	if (!by_name && parse_index(want, &index)) {
		t = index < kiln_dir_count(dir) ? kiln_dir_tensor(dir, (uint32_t)index) : NULL;
		klnt_buf_printf(&what, "#%" PRIu64, index);
	} else {
		t = kiln_dir_find_cstr(dir, want);
		klnt_buf_puts(&what, "named ");
		klnt_escape(&what, want, strlen(want), 1);
	}
	if (!t) {
		not_found(path, what.p, dir);
		klnt_buf_free(&what);
		kiln_dir_close(dir);
		return KLNT_EXIT_INVALID;
	}

	/* The payload is written straight from the mapping or owned block; write() takes at most
	 * about 2 GiB a call on Linux, which klnt_write_stdout's loop absorbs. */
	int e = klnt_write_stdout(t->data, (size_t)t->byte_length);
	rc = KLNT_EXIT_OK;
	if (e) {
		/* The reader went away (| head): stop quietly, but do not claim success. */
		if (e != EPIPE) {
			klnt_fputs_escaped(stderr, path);
			fprintf(stderr, ": IO: tensor %s: cannot write to stdout: %s\n", what.p,
				strerror(e));
		}
		rc = KLNT_EXIT_IO;
	}
	klnt_buf_free(&what);
	kiln_dir_close(dir);
	return rc;
}

const struct klnt_cmd klnt_cmd_cat = {
    .name = "cat",
    .summary = "write one tensor's raw payload bytes to stdout",
    .usage = usage,
    .run = run,
};
