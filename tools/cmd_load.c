/* SPDX-License-Identifier: MIT */
/* klnt load: a model into device memory through the load pipeline (kiln_load), with a
 * progress line, and what it took. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt load [--device DEV] [--threads N] [--direct] [--drop-cache] [--order FILE]\n"
    "                 [--inflight BYTES] [--directory-only] [--verify] FILE|URL...\n"
    "\n"
    "Load every tensor of a model (any format; a series or index brings its shards) into the\n"
    "memory of DEV with kiln_load: reader threads, each with its own engine, fill the\n"
    "destination in pieces, each thread a contiguous run of them, a bounded amount in\n"
    "flight. Progress (bytes,\n"
    "tensors, GB/s, time left) goes to stderr when it is a terminal; at the end one line on\n"
    "stdout:\n"
    "  loaded FILE: T tensors, B bytes to DEV in S s (R GB/s), N threads, at most M bytes in\n"
    "  flight[, O_DIRECT][, every byte checked against its digests (C chunks)]\n"
    "Ctrl-C stops the load and frees what it took (exit 130).\n"
    "\n"
    "Options:\n"
    "  -d, --device DEV      host (default): host memory, one arena; this build has no other\n"
    "  -t, --threads N       reader threads (default: online CPUs, at most 16)\n"
    "      --direct          read with O_DIRECT (bypass the page cache)\n"
    "      --drop-cache      drop what was read from the page cache as it lands\n"
    "  -o, --order FILE      load the tensors named in FILE, one per line, as a list in that\n"
    "                        order (each thread reads a run of it); others are not loaded\n"
    "      --inflight BYTES  bytes being read at once (default 128 MiB a thread; K, M, G\n"
    "                        suffixes)\n"
    "      --directory-only  open with KILN_OPEN_DIRECTORY_ONLY: the pipeline reads every\n"
    "                        payload byte itself (the default for URLs)\n"
    "      --verify          check every byte against the model's digests (the file's own\n"
    "                        table, klnt digest's sidecar, a model_signing statement, a\n"
    "                        Hugging Face cache blob name; KILN_OPEN_VERIFY_DIGESTS): as\n"
    "                        the open brings each file in, the pipeline then copying from\n"
    "                        the checked pages; with --directory-only (and for a URL) as\n"
    "                        the pipeline reads each part, against chunk digests (the\n"
    "                        file's own table or a sidecar)\n"
    "  -h, --help            show this help and exit\n"
    "\n"
    "Exit status: 0 loaded; 1 a file was rejected, differs from its digests or has none, or\n"
    "a name in --order is not in the model;\n"
    "2 usage error; 3 a read failed or memory ran out; 130, 143 interrupted.\n";

struct show {
	int tty, shown;
	double eta_from;
};

static int on_progress(void *ctx, const kiln_load_progress *p)
{
	struct show *s = ctx;
	if (klnt_caught_signal())
		return 1;
	if (!s->tty)
		return 0;
	double gbs = p->seconds > 0 ? (double)p->bytes / 1e9 / p->seconds : 0;
	double left = gbs > 0 ? (double)(p->bytes_total - p->bytes) / 1e9 / gbs : 0;
	fprintf(stderr,
		"\rklnt load: %.1f/%.1f MiB, %" PRIu64 "/%" PRIu64 " tensors, %.2f GB/s, %.1f s "
		"left   ",
		(double)p->bytes / 1048576.0, (double)p->bytes_total / 1048576.0, p->tensors,
		p->tensors_total, gbs, left);
	s->shown = 1;
	return 0;
}

/* The model indices of the names in `file`, one per line, in order. */
static int read_order(const struct klnt_cmd *cmd, const kiln_model *m, const char *file,
		      uint64_t **list, size_t *n)
{
	FILE *f = fopen(file, "r");
	if (!f) {
		klnt_errorf(cmd, "%s: cannot open: %s", file, strerror(errno));
		return KLNT_EXIT_IO;
	}
	size_t cap = 0;
	char *line = NULL;
	size_t lcap = 0;
	ssize_t len;
	*list = NULL;
	*n = 0;
	while ((len = getline(&line, &lcap, f)) >= 0) {
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (!len)
			continue;
		const kiln_tensor *t = kiln_model_find(m, line, (size_t)len);
		if (!t) {
			klnt_errorf(cmd, "%s: no tensor named '%s' in the model", file, line);
			free(line);
			free(*list);
			fclose(f);
			return KLNT_EXIT_INVALID;
		}
		if (*n == cap) {
			cap = cap ? cap * 2 : 64;
			uint64_t *nl = realloc(*list, cap * sizeof(**list));
			if (!nl) {
				fputs("klnt: out of memory\n", stderr);
				exit(KLNT_EXIT_IO);
			}
			*list = nl;
		}
		(*list)[(*n)++] = t->index;
	}
	int e = ferror(f) ? errno : 0;
	free(line);
	fclose(f);
	/* A directory opens but cannot be read; an empty list would load nothing asked for as if
	 * everything were: neither is an order. */
	if (e) {
		klnt_errorf(cmd, "%s: cannot read: %s", file, strerror(e));
		free(*list);
		return KLNT_EXIT_IO;
	}
	if (!*n) {
		klnt_errorf(cmd, "%s: names no tensor (one name a line)", file);
		return KLNT_EXIT_INVALID;
	}
	return KLNT_EXIT_OK;
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	enum { O_DIRECT_ = 1000, O_DROP, O_INFLIGHT, O_DIRONLY, O_VERIFY };
	static const struct option longopts[] = {
	    {"device", required_argument, NULL, 'd'},
	    {"threads", required_argument, NULL, 't'},
	    {"order", required_argument, NULL, 'o'},
	    {"direct", no_argument, NULL, O_DIRECT_},
	    {"drop-cache", no_argument, NULL, O_DROP},
	    {"inflight", required_argument, NULL, O_INFLIGHT},
	    {"directory-only", no_argument, NULL, O_DIRONLY},
	    {"verify", no_argument, NULL, O_VERIFY},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kiln_load_options lo = {.size = sizeof(lo)};
	const char *device = "host", *order = NULL;
	int dironly = 0, verify = 0, c;
	uint64_t v;
	while ((c = getopt_long(argc, argv, ":d:t:o:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			device = optarg;
			break;
		case 't':
			if (klnt_parse_u64(optarg, 16, &v) || v == 0)
				return klnt_usage_error(cmd, "--threads wants 1 to 16, not '%s'",
							optarg);
			lo.threads = (uint32_t)v;
			break;
		case 'o':
			order = optarg;
			break;
		case O_DIRECT_:
			lo.flags |= KILN_LOAD_DIRECT;
			break;
		case O_DROP:
			lo.flags |= KILN_LOAD_DROP_CACHE;
			break;
		case O_INFLIGHT:
			if (klnt_parse_size(optarg, &lo.inflight_bytes) || !lo.inflight_bytes)
				return klnt_usage_error(
				    cmd,
				    "--inflight wants a byte count (K, M, G, T suffixes), not '%s'",
				    optarg);
			break;
		case O_DIRONLY:
			dironly = 1;
			break;
		case O_VERIFY:
			verify = 1;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (argc == optind)
		return klnt_usage_error(cmd, "no file given");
	if (strcmp(device, "host") != 0)
		return klnt_usage_error(cmd,
					"device '%s': this klnt loads to host memory only (a GPU "
					"goes through the CUDA adapter, kiln_cuda_device)",
					device);
	const char *const *files = (const char *const *)argv + optind;
	uint32_t nfiles = (uint32_t)(argc - optind);
	kiln_open_options oo = {.size = sizeof(oo), .remote = klnt_remote()};
	/* A URL is read by the pipeline with ranged GETs, each checked as it lands when asked. */
	if (dironly || kiln_path_is_url(files[0]))
		oo.flags = KILN_OPEN_DIRECTORY_ONLY;
	if (verify)
		oo.flags |= KILN_OPEN_VERIFY_DIGESTS;
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open_files(files, nfiles, &oo, &m, &err);
	if (rc) {
		klnt_report(stderr, files[0], rc, &err);
		return klnt_exit_for(rc);
	}
	klnt_note_cache(m);
	uint64_t *list = NULL;
	size_t n = 0;
	if (order) {
		int e = read_order(cmd, m, order, &list, &n);
		if (e) {
			kiln_model_close(m);
			return e;
		}
	}
	struct show s = {.tty = isatty(STDERR_FILENO)};
	lo.progress = on_progress;
	lo.ctx = &s;
	klnt_catch_signals();
	kiln_arena *arena = NULL;
	kiln_load_result res;
	rc = kiln_load(m, list, order ? n : 0, &lo, NULL, &arena, &res, &err);
	if (s.shown)
		fprintf(stderr, "\r%78s\r", "");
	int sig = klnt_caught_signal();
	int status = KLNT_EXIT_OK;
	if (sig && (rc == KILN_CANCELED || !rc)) {
		status = klnt_interrupted(cmd, files[0], sig, 0); /* nothing kept */
	} else if (rc) {
		klnt_report(stderr, files[0], rc, &err);
		status = klnt_exit_for(rc);
	} else {
		kiln_model_info info;
		kiln_model_get_info(m, &info);
		printf("loaded %s: %" PRIu64 " tensors, %" PRIu64 " bytes to %s in %.3f s (%.2f "
		       "GB/s), %" PRIu32 " threads, at most %" PRIu64 " bytes in flight%s",
		       files[0], res.tensors, res.bytes, device, res.seconds,
		       res.seconds > 0 ? (double)res.bytes / 1e9 / res.seconds : 0, res.threads,
		       res.peak_inflight, res.direct ? ", O_DIRECT" : "");
		if (info.digests_verified)
			printf(", every byte checked against its digests (%" PRIu64 " chunks)",
			       info.digest_chunks);
		else if (verify)
			printf(", every byte checked against its digests as read (%" PRIu64
			       " chunks, %" PRIu64 " bytes hashed)",
			       info.digest_chunks, info.digest_bytes);
		printf("\n");
		if (klnt_flush_stdout())
			status = KLNT_EXIT_IO;
	}
	kiln_arena_free(arena);
	free(list);
	kiln_model_close(m);
	return status;
}

const struct klnt_cmd klnt_cmd_load = {
    .name = "load",
    .summary = "load a model into memory through the parallel pipeline, with progress",
    .usage = usage,
    .run = run,
};
