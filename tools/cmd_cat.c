/* SPDX-License-Identifier: MIT */
/* klnt cat: one tensor's payload bytes, exactly as stored, to stdout. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt cat [--name] [--rows A:B | --range OFFSET:LENGTH] [--source mmap|read|uring]\n"
    "                [--direct] FILE TENSOR\n"
    "\n"
    "Write the raw payload bytes of one tensor of FILE to stdout: byte_length bytes, no\n"
    "header, no conversion. FILE may be any shard of a series STEM-NNNNN-of-MMMMM.klnt: the\n"
    "tensor is looked up in every shard. TENSOR is a name, or #INDEX (a '#' followed by decimal\n"
    "digits) for the index that 'klnt inspect' shows (in a series, counted across the shards);\n"
    "unnamed tensors are only reachable by index, and so are names that contain U+0000. Only\n"
    "the structure of FILE is validated. Bytes are read with pread, so a file truncated while\n"
    "it is read is an error, not a crash.\n"
    "\n"
    "Options:\n"
    "  -n, --name  take TENSOR as a name even if it looks like #INDEX (a tensor named \"#3\")\n"
    "  -r, --rows A:B  only rows [A, B) of the tensor's first axis (4-bit tensors cut on whole\n"
    "              bytes, opaque ones on whole blocks: other bounds are refused, naming the\n"
    "              nearest valid ones)\n"
    "  -R, --range OFFSET:LENGTH  only LENGTH payload bytes from byte OFFSET\n"
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

static void not_found(const char *path, const char *what, const kiln_model *m)
{
	klnt_fputs_path(stderr, path);
	fprintf(stderr, ": %s: no tensor %s", kiln_code_name(KILN_NOTFOUND), what);
	uint64_t n = kiln_model_count(m);
	kiln_file_info info;
	kiln_model_file_info(m, 0, &info);
	if (n == 1 && !(info.flags & KILN_FLAG_NAMES))
		fputs(" (its one tensor is unnamed; use #0)", stderr);
	else if (n && !(info.flags & KILN_FLAG_NAMES))
		fprintf(stderr, " (its tensors are unnamed; use #0..#%" PRIu64 ")", n - 1);
	else
		fprintf(stderr, " (%s %" PRIu64 " tensor%s)",
			kiln_model_files(m) > 1 ? "the series has" : "the file has", n,
			n == 1 ? "" : "s");
	fputc('\n', stderr);
}

/* "A:B" into two numbers. */
static int parse_pair(const char *arg, uint64_t *a, uint64_t *b)
{
	const char *colon = strchr(arg, ':');
	if (!colon || colon == arg || !colon[1])
		return -1;
	char *first = strndup(arg, (size_t)(colon - arg));
	int rc = !first || klnt_parse_u64(first, UINT64_MAX, a) ||
		 klnt_parse_u64(colon + 1, UINT64_MAX, b);
	free(first);
	return rc ? -1 : 0;
}

/* Copy payload bytes [off, off + len) of t to stdout through a bounded buffer, with pread. */
static int write_range(const kiln_model *m, const kiln_tensor *t, uint64_t off, uint64_t len,
		       const char *path, const char *what)
{
	size_t cap = 4u << 20;
	void *buf = klnt_xmalloc(cap);
	int rc = KLNT_EXIT_OK;
	for (uint64_t done = 0; done < len;) {
		size_t step = len - done < cap ? (size_t)(len - done) : cap;
		kiln_error err;
		int r = kiln_tensor_read_range(m, t->index, off + done, step, buf, cap, NULL, NULL,
					       &err);
		if (r) {
			klnt_report(stderr, path, r, &err);
			rc = klnt_exit_for(r);
			break;
		}
		int e = klnt_write_stdout(buf, step);
		if (e) {
			/* The reader went away (| head): stop quietly, but do not claim success. */
			if (e != EPIPE) {
				klnt_fputs_path(stderr, path);
				fprintf(stderr, ": IO: tensor %s: cannot write to stdout: %s\n",
					what, strerror(e));
			}
			rc = KLNT_EXIT_IO;
			break;
		}
		done += step;
	}
	free(buf);
	return rc;
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"name", no_argument, NULL, 'n'},
	    {"rows", required_argument, NULL, 'r'},
	    {"range", required_argument, NULL, 'R'},
	    {"source", required_argument, NULL, 's'},
	    {"direct", no_argument, NULL, 'd'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int by_name = 0, c, rows = 0, range = 0;
	uint64_t a = 0, b = 0;
	kiln_open_options opts = {.size = sizeof(opts), .remote = klnt_remote()};
	while ((c = getopt_long(argc, argv, ":nr:R:s:dh", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			by_name = 1;
			break;
		case 'r':
		case 'R':
			if (rows || range)
				return klnt_usage_error(cmd,
							"--rows and --range: one of them, once");
			if (parse_pair(optarg, &a, &b))
				return klnt_usage_error(cmd, "'%s' is not %s", optarg,
							c == 'r' ? "A:B" : "OFFSET:LENGTH");
			rows = c == 'r';
			range = c == 'R';
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
	kiln_model *m;
	/* From a URL, only the tensor's bytes are fetched (row slices take their place in the
	 * file from a data pointer: those load it whole). */
	if (kiln_path_is_url(path) && !rows)
		opts.flags |= KILN_OPEN_DIRECTORY_ONLY;
	int rc = kiln_model_open(path, &opts, &m, &err);
	if (rc) {
		klnt_report(stderr, path, rc, &err);
		return klnt_exit_for(rc);
	}
	/* The bytes are the same either way; say why the requested path was not taken. */
	klnt_note_cache(m);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	if (info.direct_fallback) {
		klnt_fputs_path(stderr, path);
		fprintf(stderr, ": note: O_DIRECT unavailable (%s), read buffered\n",
			strerror(info.direct_fallback));
	}
	if (info.uring_fallback) {
		klnt_fputs_path(stderr, path);
		fprintf(stderr, ": note: io_uring unavailable (%s), read with pread\n",
			strerror(info.uring_fallback));
	}

	const kiln_tensor *t;
	uint64_t index;
	struct klnt_buf what = {0};
	if (!by_name && parse_index(want, &index)) {
		t = kiln_model_tensor(m, index);
		klnt_buf_printf(&what, "#%" PRIu64, index);
	} else {
		t = kiln_model_find_cstr(m, want);
		klnt_buf_puts(&what, "named ");
		klnt_escape(&what, want, strlen(want), 1);
	}
	if (!t) {
		not_found(path, what.p, m);
		klnt_buf_free(&what);
		kiln_model_close(m);
		return KLNT_EXIT_INVALID;
	}
	kiln_file_info fi;
	kiln_model_file_info(m, t->file, &fi);
	const char *shard_path = fi.path;
	uint64_t off = 0, len = t->byte_length;
	rc = KLNT_EXIT_OK;
	if (rows) {
		kiln_slice s = {.axis = 0, .start = a, .stop = b};
		const void *p;
		int r = kiln_tensor_slice_data(m, t->index, &s, &p, &len, &err);
		if (r) {
			klnt_report(stderr, shard_path, r, &err);
			rc = KLNT_EXIT_USAGE;
		}
		off = (uint64_t)((const uint8_t *)p - (const uint8_t *)t->data);
	} else if (range) {
		off = a;
		len = b;
		if (off > t->byte_length || len > t->byte_length - off) {
			klnt_fputs_path(stderr, shard_path);
			fprintf(stderr,
				": INVAL: tensor %s has %" PRIu64 " bytes; [%" PRIu64 ", +%" PRIu64
				") is not inside them\n",
				what.p, t->byte_length, a, b);
			rc = KLNT_EXIT_USAGE;
		}
	}
	if (rc == KLNT_EXIT_OK)
		rc = write_range(m, t, off, len, shard_path, what.p);
	klnt_buf_free(&what);
	kiln_model_close(m);
	return rc;
}

const struct klnt_cmd klnt_cmd_cat = {
    .name = "cat",
    .summary = "write one tensor's raw payload bytes to stdout",
    .usage = usage,
    .run = run,
};
