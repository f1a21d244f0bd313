/* SPDX-License-Identifier: MIT */
/*
 * Host-to-device loading through the CUDA adapter (kiln_cuda_load: kiln_stream into a ring of
 * pinned staging buffers, one cudaMemcpyAsync per landed chunk), cold and warm, against the two
 * limits a load to the GPU cannot beat, each timed right before every iteration of a row:
 *
 * - base/h2d_pinned: one cudaMemcpy of the file's size from pinned host memory (cudaHostAlloc) to
 *   device memory: the link's limit ("x_h2d" in the other rows).
 * - base/{cold,warm}/read_4MiB: a plain sequential read() of the file into a reused, page-aligned
 *   4 MiB buffer: the disk's or page cache's limit ("x_read").
 * - base/{cold,warm}/read_then_h2d: what a plain program does: read() the whole file into one
 *   pinned buffer, then one cudaMemcpy ("x_plain").
 * - base/cold/dd_direct_16MiB: what `dd if=FILE of=/dev/null iflag=direct bs=16M` does, O_DIRECT
 *   reads of 16 MiB in turn into one aligned buffer; the cold pipeline rows pair it ("x_dd").
 * - load/{cold,warm}/SOURCE[/direct][/ring:NxMiB]: kiln_model_open + kiln_cuda_load of every tensor
 *   into device buffers + kiln_model_close.
 * - pipeline/{cold,warm}/SOURCE[/direct]: the same with kiln_load onto kiln_cuda_device (reader
 *   threads, pinned staging per thread, a stream per staging buffer; docs/pipeline.md).
 * - pipeline/{cold,warm}/SOURCE/register: kiln_load with KILN_LOAD_REGISTER: no staging, the
 *   mapping's pages registered (cudaHostRegister, read only) a window at a time and copied
 *   from; the registrations are inside the timed load.
 * - pipeline/{cold,warm}/SOURCE/verify: the staged pipeline of a model opened
 *   KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS (as klnt bench's device+verify row): every
 *   chunk hashed against the file's digest table as it lands
 *   (the generator's files have one, as every file kiln writes); its rate beside the unverified
 *   row's of the same temperature is the integrity issue's GPU target.
 *
 * The load can at best run at the slower of its two limits; "x_limit" is the row's rate over
 * min(read, h2d) of its own pairing. Counters and pairing work as in bench_load.c. After the
 * first iteration of each load row, every device byte of three tensors is copied back and
 * compared with the generator (a wrong load is a skipped row, not a number).
 *
 * With no usable CUDA device the program prints "no GPU: <reason>" and exits 77 (what
 * scripts/gpu-check.sh looks for). The pipeline rows also report what kiln_load_result counted:
 * "pinned_MiB" (staging, or pages registered at once), "extra_dev_B" (device bytes beyond the
 * tensors) and, for comparison, "largest_MiB" (the largest tensor). Environment: KILN_BENCH_DIR,
 * KILN_BENCH_SMOKE, KILN_BENCH_REPS (default 5), KILN_BENCH_SIZE_MIB (default 1024, at most
 * 16384: the GPU machines have the memory for twice that, pinned and on the device),
 * KILN_BENCH_FORMAT (klnt, the default, or safetensors: the same tensors in a safetensors file),
 * KILN_BENCH_PAIR (targets: the load rows pair only cudaMemcpy, and dd when cold).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "kiln/kiln_cuda.h"
#include "measure.h"
#include "shim.h"

#define MiB          ((size_t)1 << 20)
#define RESIDENT_MAX 8
#define READ_BUF     (4u << 20)
#define DD_BUF       (16u << 20)
#define SEED         0x6b696c6e63756461ull

static struct {
	const char *path;
	uint64_t size;     /* file bytes */
	uint32_t count;    /* tensors */
	uint8_t *pinned;   /* `size` bytes of pinned host memory, for the baselines */
	uint8_t *readbuf;  /* READ_BUF bytes, page aligned */
	uint8_t *ddbuf;    /* DD_BUF bytes, page aligned */
	uint32_t *gen;     /* the generator's index of tensor i (its N in "blk.N.w") */
	uint64_t largest;  /* bytes of the largest tensor */
	uint8_t *dev;      /* device memory for every payload, at the tensors' file offsets */
	void **dests;      /* dests[i] = dev + file_offset of tensor i */
	uint64_t *lengths; /* byte_length of tensor i */
	uint64_t *offsets; /* file_offset of tensor i */
} g;

/* ---- baselines: each returns seconds, or -1 ---------------------------------------------- */

static double time_h2d(void)
{
	double t0 = kmeasure_now();
	if (cudaMemcpy(g.dev, g.pinned, g.size, cudaMemcpyHostToDevice) != cudaSuccess)
		return -1;
	return kmeasure_now() - t0;
}

static double time_read(void)
{
	double t0 = kmeasure_now();
	int64_t n = kmeasure_read_file(g.path, g.readbuf, READ_BUF);
	double t = kmeasure_now() - t0;
	return n < 0 || (uint64_t)n != g.size ? -1 : t;
}

/* dd iflag=direct bs=16M: one O_DIRECT read after another, no copy out of the buffer. */
static double time_dd(void)
{
	double t0 = kmeasure_now();
	int fd = open(g.path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		return -1;
	uint64_t done = 0;
	ssize_t r;
	while ((r = read(fd, g.ddbuf, DD_BUF)) > 0)
		done += (uint64_t)r;
	close(fd);
	return r < 0 || done != g.size ? -1 : kmeasure_now() - t0;
}

static double time_read_then_h2d(void)
{
	double t0 = kmeasure_now();
	int fd = open(g.path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	uint64_t done = 0;
	while (done < g.size) {
		size_t want = g.size - done > (64u << 20) ? (64u << 20) : (size_t)(g.size - done);
		ssize_t r = read(fd, g.pinned + done, want);
		if (r <= 0)
			break;
		done += (uint64_t)r;
	}
	close(fd);
	if (done != g.size || cudaMemcpy(g.dev, g.pinned, g.size, cudaMemcpyHostToDevice))
		return -1;
	return kmeasure_now() - t0;
}

enum { S_SELF, S_H2D, S_READ, S_PLAIN, S_DD };
enum { P_H2D = 1, P_READ = 2, P_PLAIN = 4, P_DD = 8 };

/* The baselines, each with its slot; all but the link's run under the row's temperature. */
static const struct baseline {
	unsigned flag;
	int slot;
	double (*time)(void);
} baselines[] = {{P_H2D, S_H2D, time_h2d},
		 {P_READ, S_READ, time_read},
		 {P_PLAIN, S_PLAIN, time_read_then_h2d},
		 {P_DD, S_DD, time_dd}};

/* One iteration of each paired baseline, timer paused, under the row's temperature. */
static int pair(kb_state *st, unsigned which, int cold)
{
	for (size_t i = 0; i < sizeof(baselines) / sizeof(baselines[0]); i++) {
		const struct baseline *p = &baselines[i];
		if (!(which & p->flag))
			continue;
		if (p->flag != P_H2D && kbu_set_temperature(st, g.path, cold, RESIDENT_MAX))
			return -1;
		kb_pause(st);
		double t = p->time();
		kb_resume(st);
		if (t < 0) {
			kb_skip(st, "a paired baseline failed");
			return -1;
		}
		kb_account(st, p->slot, t, (double)g.size);
	}
	return 0;
}

static void ratio_counters(kb_state *st)
{
	double rate = kb_run_rate(st, S_SELF), h2d = kb_run_rate(st, S_H2D),
	       rd = kb_run_rate(st, S_READ), plain = kb_run_rate(st, S_PLAIN),
	       dd = kb_run_rate(st, S_DD);
	kb_counter(st, "GB/s", rate / 1e9, 0);
	if (h2d > 0)
		kb_counter(st, "x_h2d", rate / h2d, 0);
	if (rd > 0)
		kb_counter(st, "x_read", rate / rd, 0);
	if (plain > 0)
		kb_counter(st, "x_plain", rate / plain, 0);
	if (h2d > 0 && rd > 0)
		kb_counter(st, "x_limit", rate / (h2d < rd ? h2d : rd), 0);
	if (dd > 0)
		kb_counter(st, "x_dd", rate / dd, 0);
}

struct base {
	unsigned which; /* a P_ flag: the row's own measurement */
	int cold;
};

static void base_body(kb_state *st, uint64_t iters, void *arg)
{
	const struct base *b = arg;
	const struct baseline *p = baselines;
	while (p->flag != b->which)
		p++;
	kb_set_bytes_per_iter(st, g.size);
	for (uint64_t i = 0; i < iters; i++) {
		if (b->which != P_H2D && kbu_set_temperature(st, g.path, b->cold, RESIDENT_MAX))
			return;
		double t = p->time();
		if (t < 0) {
			kb_skip(st, "the baseline failed");
			return;
		}
		kb_account(st, S_SELF, t, (double)g.size);
		if (b->which != P_H2D && pair(st, P_H2D, b->cold))
			return;
	}
	ratio_counters(st);
}

/* ---- kiln loads ----------------------------------------------------------------------------- */

struct load {
	uint32_t source;
	int cold, direct;
	uint32_t ring_n;  /* staging buffers; 0: the adapter's default */
	size_t ring_size; /* bytes each; 0: the adapter's default */
	uint32_t engine;  /* KILN_ENGINE_*: the reads' engine */
	int checked;
	int pipeline; /* kiln_load onto the GPUs' device table instead of kiln_cuda_load; 2: with
			 KILN_LOAD_REGISTER */
	int verify;   /* opened KILN_OPEN_VERIFY_DIGESTS */
};

static kiln_cuda_devices *gpus; /* the pipeline rows' device table */
/* KILN_BENCH_PAIR=targets: pair only what the targets compare with (the link warm, dd
 * cold), so that 8 GiB rows fit a device session. */
static int pair_targets;

/* Copy three tensors back from the device and compare them with the generator. */
static int check_device(char *why, size_t cap)
{
	uint32_t pick[3] = {0, g.count / 2, g.count - 1};
	for (int k = 0; k < 3; k++) {
		uint32_t t = pick[k];
		uint8_t *back = malloc(g.lengths[t] + 1), *want = malloc(g.lengths[t] + 1);
		int bad = !back || !want ||
			  cudaMemcpy(back, (uint8_t *)g.dests[t], g.lengths[t],
				     cudaMemcpyDeviceToHost) != cudaSuccess;
		if (!bad) {
			kbu_fill(SEED, g.gen[t], 0, want, g.lengths[t]);
			bad = memcmp(back, want, g.lengths[t]) != 0;
		}
		free(back);
		free(want);
		if (bad) {
			snprintf(why, cap, "tensor %u on the device differs from the file", t);
			return -1;
		}
	}
	return 0;
}

static void load_body(kb_state *st, uint64_t iters, void *arg)
{
	struct load *l = arg;
	char label[160];
	if (l->pipeline)
		snprintf(label, sizeof(label), "kiln_load, %s%s, default threads and %s%s",
			 kiln_source_name(l->source), l->direct ? " + O_DIRECT" : "",
			 l->pipeline == 2 ? "registered windows" : "staging",
			 l->verify ? ", every chunk hashed" : "");
	else
		snprintf(label, sizeof(label), "%s%s%s, ring %u x %zu MiB pinned",
			 kiln_source_name(l->source), l->direct ? " + O_DIRECT" : "",
			 l->engine == KILN_ENGINE_PREAD   ? ", pread"
			 : l->engine == KILN_ENGINE_URING ? ", io_uring"
							  : "",
			 l->ring_n ? l->ring_n : 4,
			 (l->ring_size ? l->ring_size
			  : l->direct  ? 8 * MiB
				       : 2 * MiB) /
			     MiB);
	kb_label(st, label);
	kb_set_bytes_per_iter(st, g.size);
	for (uint64_t i = 0; i < iters; i++) {
		unsigned pairs = pair_targets ? P_H2D : P_H2D | P_READ | P_PLAIN;
		if (l->pipeline && l->cold)
			pairs |= P_DD;
		if (pair(st, pairs, l->cold) ||
		    kbu_set_temperature(st, g.path, l->cold, RESIDENT_MAX))
			return;
		/* Clear the device bytes untimed, so a load that wrote nothing cannot pass the
		 * check. */
		kb_pause(st);
		cudaMemset(g.dev, 0, g.size);
		cudaDeviceSynchronize();
		kb_resume(st);
		double t0 = kmeasure_now();
		kiln_open_options o = {
		    .source = l->source,
		    .flags = l->verify ? KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS : 0};
		kiln_model *dir;
		kiln_error err;
		if (kiln_model_open(g.path, &o, &dir, &err)) {
			kb_skip(st, err.message);
			return;
		}
		kiln_cuda_load_options lo = {.flags = l->direct ? KILN_STREAM_DIRECT : 0,
					     .staging_count = l->ring_n,
					     .staging_size = l->ring_size,
					     .engine = l->engine};
		kiln_load_options po = {.size = sizeof(po),
					.flags = (l->direct ? KILN_LOAD_DIRECT : 0) |
						 (l->pipeline == 2 ? KILN_LOAD_REGISTER : 0),
					.engine = l->engine,
					.device = kiln_cuda_device(gpus),
					.dests = g.dests};
		kiln_load_result lr;
		int rc = l->pipeline ? kiln_load(dir, NULL, 0, &po, NULL, NULL, &lr, &err)
				     : kiln_cuda_load(dir, NULL, 0, g.dests, &lo, NULL, &err);
		kiln_model_close(dir);
		double t = kmeasure_now() - t0;
		if (rc) {
			kb_skip(st, err.message);
			return;
		}
		kb_account(st, S_SELF, t, (double)g.size);
		if (l->pipeline) {
			kb_counter(st, "pinned_MiB", (double)lr.pinned_bytes / (double)MiB, 0);
			kb_counter(st, "extra_dev_B", (double)lr.extra_device_bytes, 0);
			kb_counter(st, "largest_MiB", (double)g.largest / (double)MiB, 0);
		}
		if (!l->checked) {
			char why[120];
			kb_pause(st);
			int bad = check_device(why, sizeof(why));
			kb_resume(st);
			if (bad) {
				kb_skip(st, why);
				return;
			}
			l->checked = 1;
		}
	}
	ratio_counters(st);
}

/* ---- setup -------------------------------------------------------------------------------------
 */

static void setup(uint64_t size_mib, int safetensors)
{
	g.path = kbu_random_file_as(300, size_mib * MiB, SEED, safetensors);
	kiln_model *dir;
	kiln_error err;
	if (kiln_model_open(g.path, NULL, &dir, &err)) {
		fprintf(stderr, "bench_cuda: %s\n", err.message);
		exit(1);
	}
	g.count = kiln_model_count(dir);
	g.dests = calloc(g.count, sizeof(*g.dests));
	g.lengths = calloc(g.count, sizeof(*g.lengths));
	g.offsets = calloc(g.count, sizeof(*g.offsets));
	g.gen = calloc(g.count, sizeof(*g.gen));
	if (!g.dests || !g.lengths || !g.offsets || !g.gen) {
		fprintf(stderr, "bench_cuda: out of memory\n");
		exit(1);
	}
	uint64_t end = 0;
	for (uint32_t i = 0; i < g.count; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		g.lengths[i] = t->byte_length;
		g.offsets[i] = t->file_offset;
		if (t->byte_length > g.largest)
			g.largest = t->byte_length;
		if (!t->name || sscanf(t->name, "blk.%u.w", &g.gen[i]) != 1) {
			fprintf(stderr, "bench_cuda: tensor %u is not one the generator wrote\n",
				i);
			exit(1);
		}
		if (t->file_offset + t->byte_length > end)
			end = t->file_offset + t->byte_length;
	}
	kiln_model_close(dir);
	struct stat sb;
	if (stat(g.path, &sb)) {
		perror("bench_cuda: stat");
		exit(1);
	}
	g.size = (uint64_t)sb.st_size > end ? (uint64_t)sb.st_size : end;
	if (cudaMalloc((void **)&g.dev, g.size) != cudaSuccess ||
	    cudaHostAlloc((void **)&g.pinned, g.size, cudaHostAllocDefault) != cudaSuccess ||
	    posix_memalign((void **)&g.readbuf, 4096, READ_BUF) ||
	    posix_memalign((void **)&g.ddbuf, 4096, DD_BUF)) {
		fprintf(stderr, "bench_cuda: cannot allocate %llu bytes on the device and pinned\n",
			(unsigned long long)g.size);
		exit(1);
	}
	memset(g.pinned, 1, g.size);
	memset(g.readbuf, 1, READ_BUF);
	memset(g.ddbuf, 1, DD_BUF);
	for (uint32_t i = 0; i < g.count; i++)
		g.dests[i] = g.dev + g.offsets[i];
}

int main(int argc, char **argv)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("no GPU: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
		return 77;
	}
	struct cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		printf("device: %s, %.1f GiB\n", prop.name,
		       (double)prop.totalGlobalMem / (1 << 30));
	int smoke = getenv("KILN_BENCH_SMOKE") != NULL;
	const char *s = getenv("KILN_BENCH_SIZE_MIB"), *r = getenv("KILN_BENCH_REPS");
	uint64_t size_mib = smoke ? 16 : s ? strtoull(s, NULL, 10) : 1024;
	if (size_mib < 4 || size_mib > 16384) {
		fprintf(stderr, "bench_cuda: KILN_BENCH_SIZE_MIB must be 4..16384\n");
		return 2;
	}
	const char *pr = getenv("KILN_BENCH_PAIR");
	pair_targets = pr && !strcmp(pr, "targets");
	const char *fmt = getenv("KILN_BENCH_FORMAT");
	int safetensors = fmt && !strcmp(fmt, "safetensors");
	if (fmt && !safetensors && strcmp(fmt, "klnt")) {
		fprintf(stderr, "bench_cuda: KILN_BENCH_FORMAT is klnt or safetensors, not '%s'\n",
			fmt);
		return 2;
	}
	int reps = smoke ? 1 : r ? atoi(r) : 5;
	if (reps < 1)
		reps = 1;
	setup(size_mib, safetensors);
	kiln_error gerr;
	if (kiln_cuda_devices_open(0, &gpus, &gerr)) {
		fprintf(stderr, "bench_cuda: %s\n", gerr.message);
		return 1;
	}

	static struct base bases[] = {{P_H2D, 0},   {P_READ, 1},  {P_READ, 0},
				      {P_PLAIN, 1}, {P_PLAIN, 0}, {P_DD, 1}};
	kb_register_fixed("base/h2d_pinned", base_body, &bases[0], 3, reps);
	kb_register_fixed("base/cold/read_4MiB", base_body, &bases[1], 1, reps);
	kb_register_fixed("base/warm/read_4MiB", base_body, &bases[2], 2, reps);
	kb_register_fixed("base/cold/read_then_h2d", base_body, &bases[3], 1, reps);
	kb_register_fixed("base/warm/read_then_h2d", base_body, &bases[4], 2, reps);
	kb_register_fixed("base/cold/dd_direct_16MiB", base_body, &bases[5], 1, reps);

	/* source, cold, direct, ring count, ring size, engine, checked, pipeline, verify */
	static struct load loads[] = {{KILN_SOURCE_MMAP, 1, 0, 0, 0, 0, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 1, 1, 0, 0, 0, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 1, 0, 0, 0, KILN_ENGINE_URING, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 0, 0, 0, 0, 0, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 0, 0, 0, 0, KILN_ENGINE_URING, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 0, 0, 4, 8 * MiB, 0, 0, 0, 0},
				      {KILN_SOURCE_READ, 0, 0, 0, 0, 0, 0, 0, 0},
				      {KILN_SOURCE_MMAP, 1, 0, 0, 0, 0, 0, 1, 0},
				      {KILN_SOURCE_MMAP, 1, 1, 0, 0, 0, 0, 1, 0},
				      {KILN_SOURCE_MMAP, 0, 0, 0, 0, 0, 0, 1, 0},
				      {KILN_SOURCE_MMAP, 1, 0, 0, 0, 0, 0, 2, 0},
				      {KILN_SOURCE_MMAP, 0, 0, 0, 0, 0, 0, 2, 0},
				      {KILN_SOURCE_MMAP, 1, 0, 0, 0, 0, 0, 1, 1},
				      {KILN_SOURCE_MMAP, 0, 0, 0, 0, 0, 0, 1, 1}};
	static char names[sizeof(loads) / sizeof(loads[0])][80];
	for (size_t i = 0; i < sizeof(loads) / sizeof(loads[0]); i++) {
		struct load *l = &loads[i];
		int k = snprintf(names[i], sizeof(names[i]), "%s/%s/%s%s%s%s%s",
				 l->pipeline ? "pipeline" : "load", l->cold ? "cold" : "warm",
				 kiln_source_name(l->source), l->direct ? "/direct" : "",
				 l->engine == KILN_ENGINE_PREAD   ? "/pread"
				 : l->engine == KILN_ENGINE_URING ? "/uring_engine"
								  : "",
				 l->pipeline == 2 ? "/register" : "", l->verify ? "/verify" : "");
		if (l->ring_n)
			snprintf(names[i] + k, sizeof(names[i]) - (size_t)k, "/ring:%ux%zuMiB",
				 l->ring_n, l->ring_size / MiB);
		kb_register_fixed(names[i], load_body, l, l->cold ? 1 : 2, reps);
	}
	int rc = kb_main(argc, argv);
	kiln_cuda_devices_close(gpus);
	cudaFreeHost(g.pinned);
	cudaFree(g.dev);
	free(g.readbuf);
	free(g.ddbuf);
	free(g.gen);
	free(g.dests);
	free(g.lengths);
	free(g.offsets);
	return rc;
}
