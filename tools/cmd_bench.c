/* SPDX-License-Identifier: MIT */
/* klnt bench: cold and warm load times of a user's own file or set, for every way kiln can load
 * it, next to plain programs reading the same files, all interleaved in the same run. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "klnt.h"
#include "measure.h"

static const char usage[] =
    "usage: klnt bench FILE... [--cold | --warm] [--source NAME]... [--repeat N] [--device host]\n"
    "                  [--verify]\n"
    "       klnt bench URL... [--connections N] [--repeat N]\n"
    "\n"
    "Time loading FILE in each way kiln offers, warm (file in the page cache) and cold (its\n"
    "pages dropped with posix_fadvise(POSIX_FADV_DONTNEED) before every run, checked with\n"
    "mincore), next to plain programs reading the same bytes, and print median, min and max,\n"
    "throughput, and the ratio to a plain read() measured in the same round. Every round runs\n"
    "each row once, in a new random order, so slow moments of a shared machine hit every row.\n"
    "A FILE named like a shard of a series (STEM-NNNNN-of-MMMMM.klnt), or several FILEs, are\n"
    "loaded as one model (kiln_model_open_files): every row then covers every shard.\n"
    "\n"
    "Sources (default: all):\n"
    "  open          open + close: validation only, time to the first tensor pointer; warm,\n"
    "                the mean of 32 opens per round, printed as the time above floor's\n"
    "  mmap          open (sequential advice) and touch every page of the file\n"
    "  mmap-normal   the same with no advice (the kernel's default read-around)\n"
    "  mmap-willneed the same with KILN_ADVICE_WILLNEED (read-ahead of the whole file)\n"
    "  populate      open with KILN_OPEN_POPULATE (the kernel faults everything in)\n"
    "  auto          KILN_SOURCE_AUTO (kiln picks; the choice is printed), pages touched if\n"
    "                it left them unmapped\n"
    "  read          KILN_SOURCE_READ: the whole block into fresh owned memory with pread\n"
    "  uring         KILN_SOURCE_URING: the same with io_uring\n"
    "  read-direct   read with O_DIRECT\n"
    "  uring-direct  uring with O_DIRECT\n"
    "  read-reuse    read into one caller buffer reused across runs (one file only)\n"
    "  uring-reuse   uring into one reused caller buffer (one file only)\n"
    "  read-threads  read on one thread per online CPU (kiln_open_options.threads)\n"
    "  uring-threads uring on one thread per online CPU, a ring each\n"
    "  stream        kiln_stream of every tensor through 4 reused 2 MiB staging buffers\n"
    "  device        --device host: open + kiln_load (the pipeline) into one preallocated\n"
    "                destination; its last column: plain-threads' time over its own\n"
    "  device-direct the same with KILN_LOAD_DIRECT (O_DIRECT reads)\n"
    "Plain programs, no kiln (always measured):\n"
    "  plain         read() into one reused, page-aligned 4 MiB buffer: the ratio's base\n"
    "  plain-fresh   read() of each file into fresh memory of its size (as an owned load)\n"
    "  plain-fresh-thp the same, the memory advised MADV_HUGEPAGE (as kiln's owned blocks)\n"
    "  cat           read() with a 128 KiB buffer, as cat(1) does\n"
    "  memcpy        memcpy of the files' size between two warm buffers (warm only)\n"
    "  plain-threads --device host: pread() on N threads into the same destination, N the\n"
    "                best of 1, 2, 4, ... online CPUs (found first, printed)\n"
    "  floor         open + fstat + mmap + munmap + close of each file, no format at all: what\n"
    "                any loader of a mapped file pays (timed like open)\n";
static const char usage2[] =
    "\n"
    "URLs (s3://, http://, https://; see `klnt --help` for credentials), rows in mode remote:\n"
    "  curl          one libcurl GET of each whole object to a null sink (kiln_remote_fetch: one\n"
    "                connection, no ranges, as curl -o /dev/null): the ratio's base\n"
    "  first-byte    one GET of one byte of each object: a round trip\n"
    "  open          KILN_OPEN_DIRECTORY_ONLY open + close: header and directory alone\n"
    "  load          open with every payload byte fetched into memory (ranged GETs in flight)\n"
    "  load-1        the same over one connection\n"
    "\n"
    "Options:\n"
    "  -c, --cold        cold runs only\n"
    "  -w, --warm        warm runs only\n"
    "  -s, --source NAME a source from the list (repeatable; the plain rows always run)\n"
    "  -r, --repeat N    rounds (default 5); one untimed warm-up round comes first when warm\n"
    "      --verify      also time each kiln source with every byte checked against its\n"
    "                    digests (KILN_OPEN_VERIFY_DIGESTS; the file's own table, or make them\n"
    "                    with klnt digest): the whole-file sources as they load, stream and\n"
    "                    device as each part lands (a directory-only open): rows NAME+verify,\n"
    "                    their last column their unverified row's time over their own\n"
    "  -h, --help        show this help and exit\n"
    "\n"
    "read, uring and plain-fresh write into freshly allocated memory each run, so they include\n"
    "first-touch page faults; the -reuse rows, stream and plain reuse their buffers. In a VM the\n"
    "host may keep pages the guest dropped, so cold numbers can be better than a real cold disk.\n"
    "Cold runs also list, for each row, the read requests the disk holding the first file\n"
    "completed and their mean size (its /sys/dev/block counters around each run; medians):\n"
    "how a way reads as the disk sees it. Progress goes to stderr when it is a terminal.\n";

enum src {
	S_PLAIN,
	S_PLAIN_FRESH,
	S_PLAIN_FRESH_THP,
	S_CAT,
	S_MEMCPY,
	S_FLOOR,
	S_OPEN,
	S_MMAP,
	S_MMAP_NORMAL,
	S_MMAP_WILLNEED,
	S_POPULATE,
	S_AUTO,
	S_READ,
	S_URING,
	S_READ_D,
	S_URING_D,
	S_READ_R,
	S_URING_R,
	S_READ_T,
	S_URING_T,
	S_STREAM,
	S_DEVICE,
	S_DEVICE_D,
	S_PLAIN_THREADS,
	NSRC
};
#define FIRST_KILN S_OPEN
/* Rows: each source, then its verified twin (row s + NSRC) where it has one. */
#define NROW       (2 * NSRC)

/* The sources KILN_OPEN_VERIFY_DIGESTS checks: those whose open loads whole files, as they
 * land; stream and device (the pipeline) read later, each part checked as it lands (a
 * directory-only open). */
static int verifiable(enum src s)
{
	return (s >= S_MMAP && s <= S_URING_T) || s == S_STREAM || s == S_DEVICE || s == S_DEVICE_D;
}

/* The rows that need --device host. */
static int device_row(enum src s)
{
	return s == S_DEVICE || s == S_DEVICE_D || s == S_PLAIN_THREADS;
}

static const char *const src_name[] = {
    "plain",         "plain-fresh",   "plain-fresh-thp",
    "cat",           "memcpy",        "floor",
    "open",          "mmap",          "mmap-normal",
    "mmap-willneed", "populate",      "auto",
    "read",          "uring",         "read-direct",
    "uring-direct",  "read-reuse",    "uring-reuse",
    "read-threads",  "uring-threads", "stream",
    "device",        "device-direct", "plain-threads",
};
_Static_assert(sizeof(src_name) / sizeof(src_name[0]) == NSRC, "one name per source");

#define PLAIN_BUF (4u << 20)
#define CAT_BUF   (128u << 10)
#define RING_N    4
#define RING_SIZE (2u << 20)
/* A warm open takes microseconds: open and floor run this many times per round, and the row
 * is their mean, so one preempted open does not make the round. */
#define OPEN_REPS 32

struct bench {
	const char *const *paths;
	uint32_t npaths;
	uint64_t total;     /* bytes of all files */
	uint64_t *sizes;    /* each file's */
	uint8_t *plain_buf; /* PLAIN_BUF, page aligned */
	void *ring[RING_N]; /* RING_SIZE each */
	void *block_buf;    /* -reuse rows: the one file's block */
	size_t block_cap;
	uint32_t threads;             /* -threads rows: one per online CPU */
	uint8_t *copy_src, *copy_dst; /* memcpy row: `total` bytes each */
	int cold;                     /* the mode now running */
	uint8_t *dest;                /* device rows: the destination, `total` bytes */
	uint32_t pt_threads;          /* plain-threads: the best thread count */
	char auto_choice[2][64];      /* what AUTO picked last, warm and cold, for the table */
};

/* Drop the files' pages; returns the largest fraction still resident (1 when unknown). */
static double evict(const struct bench *b)
{
	double worst = 0;
	for (uint32_t i = 0; i < b->npaths; i++) {
		long total = 0, left = kmeasure_evict(b->paths[i]);
		kmeasure_resident(b->paths[i], &total);
		double f = left < 0 ? 1 : total ? (double)left / (double)total : 0;
		if (f > worst)
			worst = f;
	}
	return worst;
}

static int nothing(void *ctx, const kiln_chunk *c)
{
	(void)ctx;
	(void)c;
	return 0;
}

static void *page_buffer(size_t len)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, len) != 0) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	memset(p, 1, len);
	return p;
}

/* read() of the whole file through buf[0, len) (advancing through it when `advance`). */
static int read_through(const char *path, uint8_t *buf, size_t len, int advance)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t at = 0;
	for (;;) {
		ssize_t n = read(fd, buf + (advance ? at : 0), advance ? len - at : len);
		if (n < 0) {
			close(fd);
			return -1;
		}
		if (n == 0 || (advance && (at += (size_t)n) == len))
			break;
	}
	close(fd);
	return 0;
}

/* The plain programs. */
static int run_plain(const struct bench *b, enum src s)
{
	if (s == S_MEMCPY) {
		memcpy(b->copy_dst, b->copy_src, b->total);
		return 0;
	}
	if (s == S_FLOOR) {
		for (uint32_t i = 0; i < b->npaths; i++) {
			int fd = open(b->paths[i], O_RDONLY | O_CLOEXEC);
			struct stat st;
			if (fd < 0 || fstat(fd, &st) != 0) {
				if (fd >= 0)
					close(fd);
				return -1;
			}
			size_t len = st.st_size ? (size_t)st.st_size : 1;
			void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
			close(fd);
			if (m == MAP_FAILED)
				return -1;
			munmap(m, len);
		}
		return 0;
	}
	for (uint32_t i = 0; i < b->npaths; i++) {
		int rc;
		if (s == S_PLAIN_FRESH || s == S_PLAIN_FRESH_THP) {
			size_t len = b->sizes[i] ? (size_t)b->sizes[i] : 1;
			uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED)
				return -1;
			/* Memory of the kind kiln's owned blocks are: huge pages where the kernel
			 * gives them (with "madvise" THP, only when asked like this). */
			if (s == S_PLAIN_FRESH_THP)
				madvise(m, len, MADV_HUGEPAGE);
			rc = read_through(b->paths[i], m, len, 1);
			munmap(m, len);
		} else {
			rc = read_through(b->paths[i], b->plain_buf,
					  s == S_CAT ? CAT_BUF : PLAIN_BUF, 0);
		}
		if (rc)
			return -1;
	}
	return 0;
}

/* plain-threads: thread i of n reads its contiguous share of the files' bytes, laid end to end,
 * into the same place of b->dest. */
struct pt_job {
	const struct bench *b;
	uint32_t i, n;
	int rc;
};

static void *pt_main(void *arg)
{
	struct pt_job *j = arg;
	const struct bench *b = j->b;
	uint64_t share = (b->total + j->n - 1) / j->n, from = share * j->i, base = 0;
	uint64_t to = from + share < b->total ? from + share : b->total;
	for (uint32_t f = 0; f < b->npaths && !j->rc; base += b->sizes[f], f++) {
		uint64_t a = from > base ? from - base : 0, e = to - base;
		if (from >= base + b->sizes[f] || to <= base)
			continue;
		if (e > b->sizes[f])
			e = b->sizes[f];
		int fd = open(b->paths[f], O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			j->rc = -1;
			break;
		}
		while (a < e) {
			size_t want = e - a < (16u << 20) ? (size_t)(e - a) : (16u << 20);
			ssize_t got = pread(fd, b->dest + base + a, want, (off_t)a);
			if (got <= 0) {
				j->rc = -1;
				break;
			}
			a += (uint64_t)got;
		}
		close(fd);
	}
	return NULL;
}

static int plain_threads(const struct bench *b, uint32_t n)
{
	struct pt_job jobs[64];
	pthread_t th[64];
	int rc = 0;
	for (uint32_t i = 0; i < n; i++) {
		jobs[i] = (struct pt_job){b, i, n, 0};
		if (pthread_create(&th[i], NULL, pt_main, &jobs[i]))
			pt_main(&jobs[i]), th[i] = 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (th[i])
			pthread_join(th[i], NULL);
		rc |= jobs[i].rc;
	}
	return rc;
}

/* device: the pipeline into b->dest, each tensor where its bytes are in its file. */
static int run_device(const struct bench *b, int verified, int direct)
{
	kiln_model *m;
	kiln_error err;
	kiln_open_options vo = {.size = sizeof(vo),
				.flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	int rc = kiln_model_open_files(b->paths, b->npaths, verified ? &vo : NULL, &m, &err);
	if (rc) {
		klnt_report(stderr, b->paths[0], rc, &err);
		return -1;
	}
	/* The files end to end in dest, as plain-threads reads them. */
	uint64_t n = kiln_model_count(m), *base = klnt_xmalloc(b->npaths * sizeof(*base));
	for (uint32_t f = 0; f < b->npaths; f++)
		base[f] = f ? base[f - 1] + b->sizes[f - 1] : 0;
	void **dests = klnt_xmalloc((n ? n : 1) * sizeof(void *));
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		dests[i] = b->dest + base[t->file] + t->file_offset;
	}
	free(base);
	kiln_load_options o = {
	    .size = sizeof(o), .flags = direct ? KILN_LOAD_DIRECT : 0, .dests = dests};
	rc = kiln_load(m, NULL, 0, &o, NULL, NULL, NULL, &err);
	if (rc)
		klnt_report(stderr, b->paths[0], rc, &err);
	free(dests);
	kiln_model_close(m);
	return rc ? -1 : 0;
}

static void touch(const kiln_file_info *info)
{
	if (info->source != KILN_SOURCE_MMAP)
		return; /* owned memory is loaded already */
	volatile uint8_t sink = 0;
	const uint8_t *p = info->base;
	for (uint64_t i = 0; i < info->size; i += 4096)
		sink ^= p[i];
	(void)sink;
}

static const char *const auto_why[] = {
    "", "cached", "cold: populated", "larger than memory", "cannot be mapped", "owned"};

/* One timed run of source s; returns seconds, or a negative value with the error reported. */
static double run_once(struct bench *b, enum src s, int verified)
{
	double t0 = kmeasure_now();
	if (s == S_PLAIN_THREADS)
		return plain_threads(b, b->pt_threads) ? -1 : kmeasure_now() - t0;
	if (s == S_DEVICE || s == S_DEVICE_D)
		return run_device(b, verified, s == S_DEVICE_D) ? -1 : kmeasure_now() - t0;
	if (s < FIRST_KILN)
		return run_plain(b, s) ? -1 : kmeasure_now() - t0;
	kiln_open_options o = {.size = sizeof(o)};
	switch (s) {
	case S_MMAP:
		o.advice = KILN_ADVICE_SEQUENTIAL;
		break;
	case S_MMAP_WILLNEED:
		o.advice = KILN_ADVICE_WILLNEED;
		break;
	case S_POPULATE:
		o.flags = KILN_OPEN_POPULATE;
		break;
	case S_AUTO:
		o.source = KILN_SOURCE_AUTO;
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
	case S_READ_T:
	case S_URING_T:
		o.source = s == S_READ_T ? KILN_SOURCE_READ : KILN_SOURCE_URING;
		o.threads = b->threads;
		break;
	case S_READ_R:
	case S_URING_R:
		o.source = s == S_READ_R ? KILN_SOURCE_READ : KILN_SOURCE_URING;
		o.buffer = b->block_buf;
		o.buffer_size = b->block_cap;
		break;
	default:
		break;
	}
	if (verified)
		o.flags |=
		    KILN_OPEN_VERIFY_DIGESTS | (s == S_STREAM ? KILN_OPEN_DIRECTORY_ONLY : 0);
	kiln_model *set;
	kiln_error err;
	int rc = kiln_model_open_files(b->paths, b->npaths, &o, &set, &err);
	if (rc) {
		klnt_report(stderr, b->paths[0], rc, &err);
		return -1;
	}
	/* AUTO is measured as the row of what it chose: touched like mmap when it left the pages
	 * to come in on use (a file too large to populate), like populate otherwise. */
	for (uint32_t i = 0; i < kiln_model_files(set); i++) {
		kiln_file_info in;
		kiln_model_file_info(set, i, &in);
		if (s == S_MMAP || s == S_MMAP_NORMAL || s == S_MMAP_WILLNEED ||
		    (s == S_AUTO && in.auto_choice == KILN_AUTO_LARGE))
			touch(&in);
	}
	if (s == S_AUTO) {
		kiln_model_info info;
		kiln_model_get_info(set, &info);
		snprintf(b->auto_choice[b->cold], sizeof(b->auto_choice[0]), "%s, %s",
			 kiln_source_name(info.source),
			 info.auto_choice < sizeof(auto_why) / sizeof(auto_why[0])
			     ? auto_why[info.auto_choice]
			     : "?");
	} else if (s == S_STREAM) {
		kiln_stream_options so = {.size = sizeof(so),
					  .staging = b->ring,
					  .staging_count = RING_N,
					  .staging_size = RING_SIZE,
					  .on_chunk = nothing};
		rc = kiln_stream(set, NULL, 0, NULL, &so, NULL, &err);
		if (rc) {
			klnt_report(stderr, b->paths[0], rc, &err);
			kiln_model_close(set);
			return -1;
		}
	}
	kiln_model_close(set);
	return kmeasure_now() - t0;
}

/* A row's time for one round: one run, or for warm open and floor the mean of OPEN_REPS runs
 * (cold, only the first would be cold). Negative when a run failed. */
static double run_row(struct bench *b, int row)
{
	enum src s = (enum src)(row % NSRC);
	if ((s != S_OPEN && s != S_FLOOR) || b->cold)
		return run_once(b, s, row >= NSRC);
	double sum = 0;
	for (int k = 0; k < OPEN_REPS; k++) {
		double dt = run_once(b, s, 0);
		if (dt < 0)
			return dt;
		sum += dt;
	}
	return sum / OPEN_REPS;
}

struct result {
	double med, min, max, ratio; /* ratio: median over rounds of plain's time / this time */
	double above;                /* open: median over rounds of its time minus floor's */
	double dev_ratio;            /* device: median over rounds of plain-threads' time / its */
	double ver_ratio;            /* NAME+verify: median over rounds of NAME's time / its */
	double reqs, req_kib;        /* cold: the disk's read requests and their mean size */
	int ok;
};

/* xorshift: the rounds' orders need to differ, not to be unpredictable. */
static uint64_t next_random(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"cold", no_argument, NULL, 'c'},
	    {"warm", no_argument, NULL, 'w'},
	    {"source", required_argument, NULL, 's'},
	    {"repeat", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {"connections", required_argument, NULL, 'n'},
	    {"device", required_argument, NULL, 'd'},
	    {"verify", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	int want[NROW] = {0}, any = 0, cold = 1, warm = 1, verify = 0, c;
	uint64_t repeat = 5, connections = 0;
	int local_only = 0, device = 0;
	while ((c = getopt_long(argc, argv, ":cws:r:n:d:h", longopts, NULL)) != -1) {
		if (c == 'c' || c == 'w' || c == 's' || c == 'd' || c == 'V')
			local_only = c;
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
		case 'd':
			if (strcmp(optarg, "host"))
				return klnt_usage_error(
				    cmd,
				    "--device '%s': klnt bench measures the host "
				    "device; a GPU is measured by bench/bench_cuda",
				    optarg);
			device = 1;
			break;
		case 'n':
			if (klnt_parse_u64(optarg, 64, &connections) || connections == 0)
				return klnt_usage_error(
				    cmd, "--connections wants 1 to 64, not '%s'", optarg);
			break;
		case 'V':
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
	if (kiln_path_is_url(argv[optind])) {
		if (local_only)
			return klnt_usage_error(cmd, "%s is for files; a URL has the remote rows",
						local_only == 'V' ? "--verify" : "this option");
		return klnt_bench_remote((const char *const *)argv + optind,
					 (uint32_t)(argc - optind), repeat, (uint32_t)connections);
	}
	if (connections)
		return klnt_usage_error(cmd, "--connections is for URLs");
	struct bench b = {.paths = (const char *const *)argv + optind,
			  .npaths = (uint32_t)(argc - optind)};
	b.threads = kmeasure_threads();
	for (int k = 0; k < NSRC; k++)
		if ((!any || k < FIRST_KILN) && !device_row((enum src)k))
			want[k] = 1;
	if (device)
		want[S_DEVICE] = want[S_PLAIN_THREADS] = 1, want[S_DEVICE_D] |= !any;
	else if (want[S_DEVICE] || want[S_DEVICE_D] || want[S_PLAIN_THREADS])
		return klnt_usage_error(cmd, "the device rows need --device host");
	for (int k = 0; k < NSRC && verify; k++)
		want[NSRC + k] = want[k] && verifiable((enum src)k);

	/* Validate once up front so a bad file gets one clear line, not one per run; a series
	 * name brings its siblings, whose paths the rows then use. */
	kiln_model *set;
	kiln_error err;
	kiln_open_options vo = {.size = sizeof(vo), .flags = KILN_OPEN_VERIFY_DIGESTS};
	int rc = kiln_model_open_files(b.paths, b.npaths, verify ? &vo : NULL, &set, &err);
	if (rc) {
		klnt_report(stderr, b.paths[0], rc, &err);
		return klnt_exit_for(rc);
	}
	b.npaths = kiln_model_files(set);
	char **own_paths = klnt_xmalloc(b.npaths * sizeof(char *));
	b.sizes = klnt_xmalloc(b.npaths * sizeof(uint64_t));
	uint64_t tensors = kiln_model_count(set);
	for (uint32_t i = 0; i < b.npaths; i++) {
		kiln_file_info info;
		kiln_model_file_info(set, i, &info);
		own_paths[i] = strdup(info.path);
		b.sizes[i] = info.size;
		b.total += info.size;
	}
	kiln_model_close(set);
	b.paths = (const char *const *)own_paths;

	b.plain_buf = page_buffer(PLAIN_BUF);
	for (int i = 0; i < RING_N; i++)
		b.ring[i] = page_buffer(RING_SIZE);
	if (b.npaths != 1) /* one caller buffer holds one block */
		want[S_READ_R] = want[S_URING_R] = 0;
	if (want[S_READ_R] || want[S_URING_R]) {
		b.block_cap = ((size_t)b.sizes[0] + 4095) & ~(size_t)4095;
		b.block_buf = page_buffer(b.block_cap ? b.block_cap : 4096);
	}
	b.copy_src = page_buffer(b.total ? (size_t)b.total : 1);
	b.copy_dst = page_buffer(b.total ? (size_t)b.total : 1);
	if (device) {
		b.dest = page_buffer(b.total ? (size_t)b.total : 1);
		/* plain-threads' N: the fastest of 1, 2, 4, ... threads on the warm files. */
		double best = 0;
		for (uint32_t f = 0; f < b.npaths; f++)
			kmeasure_warm(b.paths[f]);
		for (uint32_t n = 1;; n = n * 2 > b.threads ? b.threads : n * 2) {
			double t = 0;
			for (int k = 0; k < 2; k++) {
				double t0 = kmeasure_now();
				plain_threads(&b, n);
				double dt = kmeasure_now() - t0;
				t = k == 0 || dt < t ? dt : t;
			}
			if (!best || t < best)
				best = t, b.pt_threads = n;
			if (n == b.threads)
				break;
		}
	}

	double *t[NROW], *ratio[NROW];
	/* Cold: the read requests the disk holding the first file completed in each run, and
	 * their mean size (the kernel's evidence of how a way reads: read-ahead, request sizes). */
	double *reqs[NROW], *req_kib[NROW];
	uint64_t r0, s0;
	int disk = cold && kmeasure_disk_reads(b.paths[0], &r0, &s0) == 0;
	for (int s = 0; s < NROW; s++) {
		t[s] = klnt_xmalloc(repeat * sizeof(double));
		ratio[s] = klnt_xmalloc(repeat * sizeof(double));
		reqs[s] = klnt_xmalloc(repeat * sizeof(double));
		req_kib[s] = klnt_xmalloc(repeat * sizeof(double));
	}
	struct result res[2][NROW] = {{{0}}};
	int tty = isatty(STDERR_FILENO), failed = 0;
	double residual = 0;
	uint64_t rnd = 0x9e3779b97f4a7c15ull;
	for (int mode = 0; mode < 2; mode++) {
		int is_cold = b.cold = mode == 1;
		if ((is_cold && !cold) || (!is_cold && !warm))
			continue;
		int live[NROW];
		for (int s = 0; s < NROW; s++)
			live[s] = want[s] && !(is_cold && s == S_MEMCPY);
		/* Warm: one untimed round first, so every row starts from the same cache state. */
		for (uint64_t round = is_cold ? 1 : 0; round <= repeat; round++) {
			int order[NROW];
			for (int s = 0; s < NROW; s++)
				order[s] = s;
			for (int s = NROW - 1; s > 0; s--) {
				int k = (int)(next_random(&rnd) % (uint64_t)(s + 1));
				int x = order[s];
				order[s] = order[k];
				order[k] = x;
			}
			for (int oi = 0; oi < NROW; oi++) {
				int s = order[oi];
				if (!live[s])
					continue;
				if (tty)
					fprintf(stderr,
						"\rklnt bench: %s round %" PRIu64 "/%" PRIu64
						" %-13s%s   ",
						is_cold ? "cold" : "warm", round, repeat,
						src_name[s % NSRC], s >= NSRC ? "+verify" : "");
				if (is_cold) {
					double left = evict(&b);
					if (left > residual)
						residual = left;
				}
				uint64_t r1 = 0, s1 = 0;
				if (is_cold && disk)
					kmeasure_disk_reads(b.paths[0], &r0, &s0);
				double dt = run_row(&b, s);
				if (dt < 0) {
					live[s] = 0, failed = 1;
					continue;
				}
				if (round > 0)
					t[s][round - 1] = dt;
				if (round > 0 && is_cold && disk &&
				    kmeasure_disk_reads(b.paths[0], &r1, &s1) == 0) {
					reqs[s][round - 1] = (double)(r1 - r0);
					req_kib[s][round - 1] =
					    r1 > r0 ? (double)(s1 - s0) / 2.0 / (double)(r1 - r0)
						    : 0;
				}
			}
		}
		/* Ratios first, while t[][i] are still the rounds' times (kmeasure_median() sorts).
		 */
		for (int s = 0; s < NROW; s++)
			if (live[s] && live[S_PLAIN]) {
				for (uint64_t i = 0; i < repeat; i++)
					ratio[s][i] = t[S_PLAIN][i] / t[s][i];
				res[mode][s].ratio = kmeasure_median(ratio[s], repeat);
			}
		/* Verified over unverified, in the same round; ratio[] is reused once done. */
		for (int s = NSRC; s < NROW; s++)
			if (live[s] && live[s - NSRC]) {
				double *v = ratio[s];
				for (uint64_t i = 0; i < repeat; i++)
					v[i] = t[s - NSRC][i] / t[s][i];
				res[mode][s].ver_ratio = kmeasure_median(v, repeat);
			}
		for (int s = S_DEVICE; s <= S_DEVICE_D; s++)
			if (live[s] && live[S_PLAIN_THREADS]) {
				for (uint64_t i = 0; i < repeat; i++)
					ratio[s][i] = t[S_PLAIN_THREADS][i] / t[s][i];
				res[mode][s].dev_ratio = kmeasure_median(ratio[s], repeat);
			}
		if (live[S_OPEN] && live[S_FLOOR]) {
			for (uint64_t i = 0; i < repeat; i++)
				ratio[S_OPEN][i] = t[S_OPEN][i] - t[S_FLOOR][i];
			res[mode][S_OPEN].above = kmeasure_median(ratio[S_OPEN], repeat);
		}
		for (int s = 0; s < NROW; s++) {
			struct result *r = &res[mode][s];
			if (!live[s])
				continue;
			r->ok = 1;
			r->med = kmeasure_median(t[s], repeat);
			r->min = t[s][0];
			r->max = t[s][repeat - 1];
			if (is_cold && disk) {
				r->reqs = kmeasure_median(reqs[s], repeat);
				r->req_kib = kmeasure_median(req_kib[s], repeat);
			}
		}
	}
	if (tty)
		fprintf(stderr, "\r%70s\r", "");

	double gb = (double)b.total / 1e9;
	if (b.npaths == 1)
		printf("file %s: %" PRIu64 " tensors, %" PRIu64 " bytes, %" PRIu64 " rounds\n\n",
		       b.paths[0], tensors, b.total, repeat);
	else
		printf("set of %" PRIu32 " files (%s, ...): %" PRIu64 " tensors, %" PRIu64
		       " bytes, %" PRIu64 " rounds\n\n",
		       b.npaths, b.paths[0], tensors, b.total, repeat);
	printf("%-5s  %-20s  %10s  %10s  %10s  %8s  %9s%s\n", "mode", "source", "median ms",
	       "min ms", "max ms", "GB/s", "vs plain", verify ? "  vs unverified" : "");
	for (int mode = 0; mode < 2; mode++) {
		for (int row = 0; row < NROW; row++) {
			/* Each verified row right under its source's. */
			int s = row / 2 + (row % 2 ? NSRC : 0);
			const struct result *r = &res[mode][s];
			if (!r->ok)
				continue;
			char name[32];
			snprintf(name, sizeof(name), "%s%s", src_name[s % NSRC],
				 s >= NSRC ? "+verify" : "");
			printf("%-5s  %-20s  %10.3f  %10.3f  %10.3f  ", mode ? "cold" : "warm",
			       name, r->med * 1e3, r->min * 1e3, r->max * 1e3);
			if (s == S_OPEN && res[mode][S_FLOOR].ok) { /* reads the directory only */
				if (r->above < 1e-3 && r->above > -1e-3)
					printf("%8s  %+7.1fus", "-", r->above * 1e6);
				else
					printf("%8s  %+7.2fms", "-", r->above * 1e3);
			} else if (s == S_OPEN || s == S_FLOOR)
				printf("%8s  %9s", "-", "-");
			else if (device_row((enum src)s) && s != S_PLAIN_THREADS &&
				 res[mode][S_PLAIN_THREADS].ok)
				printf("%8.2f  %8.2fx", gb / r->med, r->dev_ratio);
			else
				printf("%8.2f  %8.2fx", gb / r->med, r->ratio);
			if (s == S_PLAIN_THREADS)
				printf("  (%" PRIu32 " threads)", b.pt_threads);
			if (s == S_AUTO)
				printf("  (%s)", b.auto_choice[mode]);
			if (s >= NSRC && res[mode][s - NSRC].ok)
				printf("  %13.3fx", r->ver_ratio);
			putchar('\n');
		}
	}
	printf("\nvs plain: the median over rounds of plain's time over the row's, both from the "
	       "same round;\nfor open, the median over rounds of its time minus floor's (what "
	       "validation adds)%s\n",
	       device ? ";\nfor device, the median over rounds of plain-threads' time over its own"
		      : "");
	if (verify)
		printf("vs unverified: the median over rounds of the source's unverified time over "
		       "its "
		       "verified one\n");
	if (cold)
		printf("cold runs: at most %.2f%% of the files' pages were still cached after "
		       "eviction (mincore)\n",
		       residual * 100);
	if (disk) {
		printf("\ncold, the read requests of the disk holding %s (its block device's "
		       "counters around each run; medians over rounds):\n",
		       b.paths[0]);
		for (int row = 0; row < NROW; row++) {
			int s = row / 2 + (row % 2 ? NSRC : 0);
			const struct result *r = &res[1][s];
			if (!r->ok || s == S_OPEN || s == S_FLOOR)
				continue;
			char name[32];
			snprintf(name, sizeof(name), "%s%s", src_name[s % NSRC],
				 s >= NSRC ? "+verify" : "");
			printf("  %-20s  %7.0f requests of %7.0f KiB\n", name, r->reqs, r->req_kib);
		}
	}
	for (int s = 0; s < NROW; s++) {
		free(t[s]);
		free(ratio[s]);
		free(reqs[s]);
		free(req_kib[s]);
	}
	for (uint32_t i = 0; i < b.npaths; i++)
		free(own_paths[i]);
	free(own_paths);
	free(b.sizes);
	free(b.block_buf);
	free(b.plain_buf);
	free(b.copy_src);
	free(b.copy_dst);
	free(b.dest);
	for (int i = 0; i < RING_N; i++)
		free(b.ring[i]);
	int e = klnt_flush_stdout();
	return e ? KLNT_EXIT_IO : failed ? KLNT_EXIT_IO : KLNT_EXIT_OK;
}

const struct klnt_cmd klnt_cmd_bench = {
    .name = "bench",
    .summary = "time cold and warm loads of a file or set, every source, against plain programs",
    .usage = usage,
    .usage2 = usage2,
    .run = run,
};
