/* SPDX-License-Identifier: MIT */
/* klnt bench: cold and warm load times of a user's own file, for every way kiln can load it,
 * next to a plain sequential read() of the same file measured in the same run. */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "klnt.h"
#include "measure.h"

static const char usage[] =
    "usage: klnt bench FILE [--cold | --warm] [--source NAME]... [--repeat N]\n"
    "\n"
    "Time loading FILE in each way kiln offers, warm (file in the page cache) and cold (its\n"
    "pages dropped with posix_fadvise(POSIX_FADV_DONTNEED) before every run, checked with\n"
    "mincore), and print median, min and max, throughput, and the ratio to a plain\n"
    "sequential read() of the same file with a 4 MiB buffer measured in the same run.\n"
    "\n"
    "Sources (default: all):\n"
    "  open          kiln_dir_open + close: validation only, time to the first tensor pointer\n"
    "  mmap          open (sequential advice) and touch every page of the file\n"
    "  populate      open with KILN_OPEN_POPULATE (the kernel faults everything in)\n"
    "  read          KILN_SOURCE_READ: the whole block into owned memory with pread\n"
    "  uring         KILN_SOURCE_URING: the same with io_uring (4 MiB chunks, 32 in flight)\n"
    "  read-direct   read with O_DIRECT\n"
    "  uring-direct  uring with O_DIRECT\n"
    "  read-reuse    read into one caller buffer reused across runs (kiln_open_options.buffer)\n"
    "  uring-reuse   uring into one reused caller buffer\n"
    "  stream        kiln_stream of every tensor through 4 reused 4 MiB staging buffers\n"
    "  plain         the baseline: read() into one reused 4 MiB buffer, no kiln\n"
    "\n"
    "Options:\n"
    "  -c, --cold        cold runs only\n"
    "  -w, --warm        warm runs only\n"
    "  -s, --source NAME a source from the list (repeatable; plain is always measured)\n"
    "  -r, --repeat N    runs per measurement (default 5); the first warm run is not counted\n"
    "  -h, --help        show this help and exit\n"
    "\n"
    "read and uring write into freshly allocated memory each run, so they include first-touch\n"
    "page faults; the -reuse rows, stream and plain reuse their buffers. In a VM the host may "
    "keep\n"
    "pages the guest dropped, so cold numbers can be better than a real cold disk.\n"
    "Progress goes to stderr when it is a terminal.\n";

enum src {
	S_OPEN,
	S_MMAP,
	S_POPULATE,
	S_READ,
	S_URING,
	S_READ_D,
	S_URING_D,
	S_READ_R,
	S_URING_R,
	S_STREAM,
	S_PLAIN,
	NSRC
};

static const char *const src_name[NSRC] = {
    "open",         "mmap",       "populate",    "read",   "uring", "read-direct",
    "uring-direct", "read-reuse", "uring-reuse", "stream", "plain",
};

/* Drop the file's pages; returns the fraction still resident afterwards (1 when unknown). */
static double evict(const char *path)
{
	long total = 0, left = kmeasure_evict(path);
	kmeasure_resident(path, &total);
	return left < 0 ? 1 : total ? (double)left / (double)total : 0;
}

static int nothing(void *ctx, const kiln_chunk *c)
{
	(void)ctx;
	(void)c;
	return 0;
}

/* One timed run; returns seconds, or a negative value with the error reported. */
static void *page_buffer(size_t len)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, len) != 0) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	memset(p, 0, len);
	return p;
}

static double run_once(const char *path, enum src s, uint8_t *plain_buf, void **ring,
		       void *block_buf, size_t block_cap)
{
	double t0 = kmeasure_now();
	if (s == S_PLAIN)
		return kmeasure_read_file(path, plain_buf, 4u << 20) < 0 ? -1 : kmeasure_now() - t0;
	kiln_open_options o = {.size = sizeof(o)};
	switch (s) {
	case S_MMAP:
		o.advice = KILN_ADVICE_SEQUENTIAL;
		break;
	case S_POPULATE:
		o.flags = KILN_OPEN_POPULATE;
		break;
	case S_READ_D:
		o.flags = KILN_OPEN_DIRECT; /* fall through */
	case S_READ:
		o.source = KILN_SOURCE_READ;
		break;
	case S_URING_D:
		o.flags = KILN_OPEN_DIRECT; /* fall through */
	case S_URING:
		o.source = KILN_SOURCE_URING;
		break;
	case S_READ_R:
	case S_URING_R:
		o.source = s == S_READ_R ? KILN_SOURCE_READ : KILN_SOURCE_URING;
		o.buffer = block_buf;
		o.buffer_size = block_cap;
		break;
	default:
		break;
	}
	kiln_dir *dir;
	kiln_error err;
	int rc = kiln_dir_open(path, &o, &dir, &err);
	if (rc) {
		klnt_report(stderr, path, rc, &err);
		return -1;
	}
	kiln_dir_info info;
	kiln_dir_get_info(dir, &info);
	if (s == S_MMAP) {
		volatile uint8_t sink = 0;
		const uint8_t *p = info.base;
		for (uint64_t i = 0; i < info.block_length; i += 4096)
			sink ^= p[i];
		(void)sink;
	} else if (s == S_STREAM) {
		kiln_stream_options so = {.size = sizeof(so),
					  .staging = ring,
					  .staging_count = 4,
					  .staging_size = 4u << 20,
					  .on_chunk = nothing};
		rc = kiln_stream(dir, NULL, 0, NULL, &so, NULL, &err);
		if (rc) {
			klnt_report(stderr, path, rc, &err);
			kiln_dir_close(dir);
			return -1;
		}
	}
	kiln_dir_close(dir);
	return kmeasure_now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

struct result {
	double med, min, max, residual;
	int ok;
};

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"cold", no_argument, NULL, 'c'},         {"warm", no_argument, NULL, 'w'},
	    {"source", required_argument, NULL, 's'}, {"repeat", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
	};
	int want[NSRC] = {0}, any = 0, cold = 1, warm = 1, c;
	uint64_t repeat = 5;
	while ((c = getopt_long(argc, argv, ":cws:r:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			warm = 0;
			cold = 1;
			break;
		case 'w':
			cold = 0;
			warm = 1;
			break;
		case 's': {
			int k = 0;
			while (k < NSRC && strcmp(src_name[k], optarg) != 0)
				k++;
			if (k == NSRC)
				return klnt_usage_error(cmd, "unknown source '%s'", optarg);
			want[k] = any = 1;
			break;
		}
		case 'r':
			if (klnt_parse_u64(optarg, 1000, &repeat) || repeat == 0)
				return klnt_usage_error(cmd, "--repeat wants 1 to 1000, not '%s'",
							optarg);
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (argc - optind != 1)
		return klnt_usage_error(cmd,
					argc == optind ? "no file given" : "one file at a time");
	const char *path = argv[optind];
	for (int k = 0; k < NSRC; k++)
		if (!any || k == S_PLAIN)
			want[k] = 1;

	/* Validate once up front so a bad file gets one clear line, not one per run. */
	kiln_dir *dir;
	kiln_error err;
	int rc = kiln_dir_open(path, NULL, &dir, &err);
	if (rc) {
		klnt_report(stderr, path, rc, &err);
		return klnt_exit_for(rc);
	}
	kiln_dir_info info;
	kiln_dir_get_info(dir, &info);
	kiln_dir_close(dir);

	/* Page-aligned and touched once: malloc's 4 MiB blocks start 16 bytes past a page, which
	 * on some CPUs makes every copy into them several times slower, and the plain baseline
	 * with them. */
	uint8_t *plain_buf = page_buffer(4u << 20);
	void *ring[4];
	for (int i = 0; i < 4; i++)
		ring[i] = page_buffer(4u << 20);
	double *t = klnt_xmalloc(repeat * sizeof(double));
	/* One block-sized buffer, touched once, for the -reuse rows. */
	size_t block_cap = ((size_t)info.block_length + 4095) & ~(size_t)4095;
	void *block_buf = NULL;
	if ((want[S_READ_R] || want[S_URING_R]) && posix_memalign(&block_buf, 4096, block_cap))
		block_buf = NULL;
	if (block_buf)
		memset(block_buf, 0, block_cap);
	else
		want[S_READ_R] = want[S_URING_R] = 0;
	struct result res[2][NSRC] = {{{0}}};
	int tty = isatty(STDERR_FILENO), failed = 0;
	/* plain first in each mode: the ratios need it. */
	static const enum src order[NSRC] = {S_PLAIN,  S_OPEN,    S_MMAP,   S_POPULATE,
					     S_READ,   S_URING,   S_READ_D, S_URING_D,
					     S_READ_R, S_URING_R, S_STREAM};
	for (int mode = 0; mode < 2; mode++) {
		int is_cold = mode == 1;
		if ((is_cold && !cold) || (!is_cold && !warm))
			continue;
		for (int oi = 0; oi < NSRC; oi++) {
			enum src s = order[oi];
			if (!want[s])
				continue;
			struct result *r = &res[mode][s];
			if (!is_cold && run_once(path, s, plain_buf, ring, block_buf, block_cap) <
					    0) { /* warm-up */
				failed = 1;
				continue;
			}
			r->ok = 1;
			for (uint64_t i = 0; i < repeat && r->ok; i++) {
				if (tty)
					fprintf(stderr,
						"\rklnt bench: %s %-12s %" PRIu64 "/%" PRIu64 "   ",
						is_cold ? "cold" : "warm", src_name[s], i + 1,
						repeat);
				if (is_cold) {
					double left = evict(path);
					if (left > r->residual)
						r->residual = left;
				}
				t[i] = run_once(path, s, plain_buf, ring, block_buf, block_cap);
				if (t[i] < 0)
					r->ok = 0, failed = 1;
			}
			if (!r->ok)
				continue;
			qsort(t, repeat, sizeof(double), cmp_double);
			r->med =
			    repeat % 2 ? t[repeat / 2] : (t[repeat / 2 - 1] + t[repeat / 2]) / 2;
			r->min = t[0];
			r->max = t[repeat - 1];
		}
	}
	if (tty)
		fprintf(stderr, "\r%60s\r", "");

	double gb = (double)info.block_length / 1e9;
	printf("file %s: %" PRIu32 " tensors, %" PRIu64 " bytes (payload_base %" PRIu64
	       "), %" PRIu64 " runs each\n\n",
	       path, info.tensor_count, info.block_length, info.payload_base, repeat);
	printf("%-5s  %-12s  %10s  %10s  %10s  %8s  %9s\n", "mode", "source", "median ms", "min ms",
	       "max ms", "GB/s", "vs plain");
	for (int mode = 0; mode < 2; mode++) {
		const struct result *plain = &res[mode][S_PLAIN];
		for (int oi = 0; oi < NSRC; oi++) {
			enum src s = order[oi];
			const struct result *r = &res[mode][s];
			if (!r->ok)
				continue;
			printf("%-5s  %-12s  %10.3f  %10.3f  %10.3f  ", mode ? "cold" : "warm",
			       src_name[s], r->med * 1e3, r->min * 1e3, r->max * 1e3);
			if (s == S_OPEN)
				printf("%8s  %9s\n", "-", "-"); /* reads the directory only */
			else
				printf("%8.2f  %8.2fx\n", gb / r->med,
				       plain->ok ? plain->med / r->med : 0.0);
		}
	}
	double worst = 0;
	for (int s = 0; s < NSRC; s++)
		if (res[1][s].residual > worst)
			worst = res[1][s].residual;
	if (cold)
		printf("\ncold runs: at most %.2f%% of the file's pages were still cached after "
		       "eviction (mincore)\n",
		       worst * 100);
	free(t);
	free(block_buf);
	free(plain_buf);
	for (int i = 0; i < 4; i++)
		free(ring[i]);
	int e = klnt_flush_stdout();
	return e ? KLNT_EXIT_IO : failed ? KLNT_EXIT_IO : KLNT_EXIT_OK;
}

const struct klnt_cmd klnt_cmd_bench = {
    .name = "bench",
    .summary = "time cold and warm loads of a file, for every source, against plain read()",
    .usage = usage,
    .run = run,
};
