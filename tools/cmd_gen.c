/* SPDX-License-Identifier: MIT */
/* klnt gen: a synthetic model file to try kiln on, shaped like a transformer checkpoint. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt gen OUT --tensors N --bytes SIZE [--seed S] [--unnamed] [--no-sync] "
    "[--no-digests]\n"
    "\n"
    "Write a synthetic model file OUT with exactly N tensors and about SIZE payload bytes,\n"
    "laid out like a transformer checkpoint: token_embd.weight, then per layer\n"
    "blk.L.attn_norm.weight (f32), blk.L.attn_qkv.weight (f16), blk.L.attn_output.weight\n"
    "(bf16), blk.L.ffn_up.weight (e2m1, block-quantized along its last axis in groups of 32)\n"
    "with blk.L.ffn_up.scale (e8m0), blk.L.ffn_down.weight (opaque dtype 4108, layout Q4_K,\n"
    "144-byte blocks: GGUF's Q4_K as kiln imports it) and blk.L.ffn_norm.weight (f32), then\n"
    "output_norm.weight. Payload bytes are pseudo-random (from --seed), streamed to disk,\n"
    "never held in memory. On a terminal, progress is shown on stderr.\n"
    "\n"
    "SIZE takes a suffix: K, M, G (powers of 1024; KiB, MiB, GiB also accepted).\n"
    "\n"
    "Options:\n"
    "  -n, --tensors N  number of tensors (1 or more)\n"
    "  -b, --bytes SIZE total payload bytes to aim for (the big weights share it)\n"
    "  -s, --seed S     seed for the payload bytes (default 1)\n"
    "  -u, --unnamed    leave tensors unnamed; names for more than a few thousand tensors do\n"
    "                   not fit the format's 16-bit heap offsets\n"
    "      --no-sync    do not fsync OUT before renaming it into place\n"
    "      --no-digests write the tensors alone, without the file's digest table\n"
    "                   (its last tensor, kiln.digests; docs/integrity.md)\n"
    "  -h, --help       show this help and exit\n"
    "\n"
    "OUT is replaced atomically and keeps its mode; a symlink is followed. Nothing is written\n"
    "when the file system has less free space than the file needs. SIGINT or SIGTERM stop the\n"
    "write and leave OUT as it was.\n"
    "\n"
    "Exit status: 0 ok; 1 the tensors cannot be encoded (e.g. LIMIT for too many names);\n"
    "2 usage error; 3 OUT could not be written, or not synced, or does not fit;\n"
    "130, 143 interrupted by SIGINT, SIGTERM.\n";

#define HIDDEN 256 /* row length: a multiple of the e2m1 group (32) and the Q4_K block (256) */

enum kind { K_EMBED, K_NORM, K_QKV, K_OUT, K_UP, K_UP_SCALE, K_DOWN, K_NKINDS };

/* Bytes of one row of HIDDEN elements for the big kinds. */
static uint64_t row_bytes(enum kind k)
{
	switch (k) {
	case K_EMBED:
	case K_QKV:
	case K_OUT:
		return HIDDEN * 2;
	case K_UP:
		return HIDDEN / 2;
	case K_DOWN:
		return HIDDEN / 256 * 144;
	default:
		return 0;
	}
}

static int is_big(enum kind k)
{
	return row_bytes(k) != 0;
}

/* Pseudo-random payload: splitmix64 of (seed, tensor, position), so any chunk can be produced
 * on its own and the file is the same for the same arguments. */
struct gen_ctx {
	uint64_t seed;
	const kiln_tensor_spec *t;
	/* progress on a terminal */
	int tty, shown;
	uint64_t total, done;
	struct timespec last;
};

static void show_progress(struct gen_ctx *g, size_t len)
{
	g->done += len;
	if (!g->tty)
		return;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double since =
	    (double)(now.tv_sec - g->last.tv_sec) + (now.tv_nsec - g->last.tv_nsec) / 1e9;
	if (g->shown && since < 0.25 && g->done < g->total)
		return;
	g->last = now;
	g->shown = 1;
	fprintf(stderr, "\rklnt gen: %" PRIu64 " of %" PRIu64 " MiB (%d%%)   ", g->done >> 20,
		g->total >> 20, g->total ? (int)(100.0 * (double)g->done / (double)g->total) : 100);
}

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static int produce(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	struct gen_ctx *g = ctx;
	/* Stopping here makes kiln_write_file remove its temporary file and return CANCELED. */
	if (klnt_caught_signal())
		return ECANCELED;
	show_progress(g, len);
	uint8_t *p = buf;
	uint64_t base = g->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor << 40);
	size_t i = 0;
	for (; i < len && (offset + i) % 8; i++)
		p[i] = (uint8_t)mix(base + (offset + i) / 8);
	for (; i + 8 <= len; i += 8) {
		uint64_t v = mix(base + (offset + i) / 8);
		memcpy(p + i, &v, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)(mix(base + (offset + i) / 8) >> (8 * ((offset + i) % 8)));
	/* e8m0 scales: keep them finite (0xFF is NaN) and near 1.0. */
	if (g->t[tensor].dtype == KILN_DT_E8M0)
		for (i = 0; i < len; i++)
			p[i] = (uint8_t)(120 + p[i] % 15);
	return 0;
}

/* Refuse up front when the file system cannot hold the file: finding out after minutes of
 * writing, with the disk full for everyone else, is worse. The file being replaced is only freed
 * after the rename, so it does not count as free space. Returns 0 or an exit status. */
static int check_space(const struct klnt_cmd *cmd, const char *out, uint64_t need)
{
	char *real = realpath(out, NULL); /* the writer follows symlinks; so does this */
	const char *p = real ? real : out;
	const char *slash = strrchr(p, '/');
	char *dir = slash ? strndup(p, (size_t)(slash - p) + 1) : strdup(".");
	struct statvfs sv;
	int ok = dir && statvfs(dir, &sv) == 0;
	free(dir);
	free(real);
	if (!ok)
		return 0; /* the writer reports what is wrong with the directory */
	uint64_t avail;
	if (__builtin_mul_overflow((uint64_t)sv.f_bavail, (uint64_t)sv.f_frsize, &avail))
		avail = UINT64_MAX;
	if (need <= avail)
		return 0;
	klnt_errorf(cmd,
		    "%s: needs %" PRIu64 " bytes, but its file system has only %" PRIu64
		    " bytes free; nothing was written",
		    out, need, avail);
	return KLNT_EXIT_IO;
}

static int write_out(const struct klnt_cmd *cmd, const char *out, const kiln_tensor_spec *t,
		     uint32_t n, uint32_t wflags, struct gen_ctx *g, int named)
{
	g->tty = isatty(STDERR_FILENO);
	klnt_catch_signals();
	kiln_error err;
	int rc = kiln_write_file(out, t, n, wflags, &err);
	if (g->shown)
		fprintf(stderr, "\r%60s\r", "");
	int sig = klnt_caught_signal();
	if (sig && (rc == KILN_CANCELED || rc == KILN_OK || rc == KILN_UNSYNCED))
		return klnt_interrupted(cmd, out, sig, rc != KILN_CANCELED);
	if (!rc)
		return KLNT_EXIT_OK;
	klnt_report(stderr, out, rc, &err);
	if (rc == KILN_LIMIT && named)
		klnt_errorf(cmd,
			    "the names of %" PRIu32
			    " tensors do not fit the heap's 16-bit offsets; "
			    "try --unnamed",
			    n);
	return klnt_exit_for(rc);
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"tensors", required_argument, NULL, 'n'}, {"bytes", required_argument, NULL, 'b'},
	    {"seed", required_argument, NULL, 's'},    {"unnamed", no_argument, NULL, 'u'},
	    {"no-sync", no_argument, NULL, 'S'},       {"no-digests", no_argument, NULL, 'D'},
	    {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
	};
	uint64_t n = 0, bytes = 0, seed = 1;
	int have_n = 0, have_bytes = 0, unnamed = 0, c;
	uint32_t wflags = 0;
	while ((c = getopt_long(argc, argv, ":n:b:s:uh", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (klnt_parse_u64(optarg, UINT32_MAX, &n) || n == 0)
				return klnt_usage_error(cmd, "--tensors wants 1 to %u, not '%s'",
							UINT32_MAX, optarg);
			have_n = 1;
			break;
		case 'b':
			if (klnt_parse_size(optarg, &bytes))
				return klnt_usage_error(
				    cmd, "--bytes wants a size like 1G, not '%s'", optarg);
			have_bytes = 1;
			break;
		case 's':
			if (klnt_parse_u64(optarg, UINT64_MAX, &seed))
				return klnt_usage_error(cmd, "--seed wants a number, not '%s'",
							optarg);
			break;
		case 'u':
			unnamed = 1;
			break;
		case 'S':
			wflags |= KILN_WRITE_NO_SYNC;
			break;
		case 'D':
			wflags |= KILN_WRITE_NO_DIGESTS;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (argc - optind != 1)
		return klnt_usage_error(cmd, argc == optind ? "no output file given"
							    : "one output file only");
	if (!have_n || !have_bytes)
		return klnt_usage_error(cmd, "--tensors and --bytes are required");
	const char *out = argv[optind];

	/* The kinds in file order: embedding, layers, final norm; a quantized weight is never cut
	 * off from its scale (a lone K_UP at the end becomes a norm). */
	static const enum kind layer[] = {K_NORM, K_QKV, K_OUT, K_UP, K_UP_SCALE, K_DOWN, K_NORM};
	const size_t per_layer = sizeof(layer) / sizeof(layer[0]);
	enum kind *kinds = klnt_xmalloc((size_t)n * sizeof(*kinds));
	uint64_t nbig = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (i == 0)
			kinds[i] = K_EMBED;
		else if (i == n - 1 && n > 2)
			kinds[i] = K_NORM;
		else
			kinds[i] = layer[(i - 1) % per_layer];
		if (kinds[i] == K_UP && i + 1 >= n - (n > 2))
			kinds[i] = K_NORM;
		if (kinds[i] == K_UP_SCALE && (i == 0 || kinds[i - 1] != K_UP))
			kinds[i] = K_NORM;
		nbig += is_big(kinds[i]);
	}
	uint64_t budget = nbig ? bytes / nbig : 0;

	kiln_tensor_spec *t = calloc((size_t)n, sizeof(*t));
	char *names = unnamed ? NULL : klnt_xmalloc((size_t)n * 40);
	if (!t) {
		klnt_errorf(cmd, "%s: out of memory for %" PRIu64 " tensors", out, n);
		return KLNT_EXIT_IO;
	}
	struct gen_ctx g = {.seed = seed, .t = t};
	uint64_t names_total = 0, layouts = 0; /* heap bytes so far */
	/* Names first: layout names go after all of them in the heap. */
	for (uint64_t i = 0; i < n && names; i++) {
		enum kind k = kinds[i];
		kiln_tensor_spec *s = &t[i];
		uint64_t layer_no = i ? (i - 1) / per_layer : 0;
		{ /* the layer's slot decides the name */
			static const char *const at[] = {"attn_norm.weight",   "attn_qkv.weight",
							 "attn_output.weight", "ffn_up.weight",
							 "ffn_up.scale",       "ffn_down.weight",
							 "ffn_norm.weight"};
			size_t pos = i ? (i - 1) % per_layer : 0;
			char *nm = names + i * 40;
			int len;
			if (k == K_EMBED)
				len = snprintf(nm, 40, "token_embd.weight");
			else if (i == n - 1 && n > 2)
				len = snprintf(nm, 40, "output_norm.weight");
			else if (k != layer[pos]) /* a weight cut short at the end became a norm */
				len = snprintf(nm, 40, "blk.%" PRIu64 ".norm%zu.weight", layer_no,
					       pos);
			else
				len = snprintf(nm, 40, "blk.%" PRIu64 ".%s", layer_no, at[pos]);
			s->name = nm;
			s->name_len = (size_t)len;
			names_total += (uint64_t)len;
		}
	}
	for (uint64_t i = 0; i < n; i++) {
		enum kind k = kinds[i];
		kiln_tensor_spec *s = &t[i];
		uint64_t rows = is_big(k) ? budget / row_bytes(k) : 0;
		if (is_big(k) && rows == 0)
			rows = 1;
		s->rank = 2;
		s->shape[0] = rows;
		s->shape[1] = HIDDEN;
		s->read = produce;
		s->read_ctx = &g;
		switch (k) {
		case K_EMBED:
		case K_QKV:
			s->dtype = KILN_DT_F16;
			break;
		case K_OUT:
			s->dtype = KILN_DT_BF16;
			break;
		case K_NORM:
			s->dtype = KILN_DT_F32;
			s->rank = 1;
			s->shape[0] = HIDDEN;
			s->shape[1] = 0;
			break;
		case K_UP:
			s->dtype = KILN_DT_E2M1;
			s->quant_scheme = KILN_QUANT_BLOCK;
			s->quant_axis = 1;
			s->group_size = 32;
			s->scale_index = (uint32_t)(i + 1);
			break;
		case K_UP_SCALE:
			s->dtype = KILN_DT_E8M0;
			s->shape[0] = t[i - 1].shape[0];
			s->shape[1] = HIDDEN / 32;
			break;
		case K_DOWN:
			/* Layout names share the heap's 16-bit offsets with the tensor names: once
			 * they would not fit, the remaining ffn_down weights are plain f16. */
			if (names_total + layouts + 4 <= 0xFFFF) {
				/* The code kiln gives GGUF's Q4_K (4096 + its ggml id), so the
				 * converters know it: `klnt export --to gguf` takes it as Q4_K. */
				const kiln_ggml_type *q4k = kiln_ggml_type_by_name("Q4_K");
				s->dtype = (uint16_t)(KILN_DT_OPAQUE_MIN + q4k->id);
				s->layout = q4k->name;
				s->layout_len = (uint16_t)strlen(q4k->name);
				s->block_size = q4k->block_bytes;
				s->byte_length = rows * row_bytes(k);
				layouts += 4;
			} else {
				s->dtype = KILN_DT_F16;
				s->shape[0] = rows * row_bytes(K_DOWN) / row_bytes(K_QKV);
				if (s->shape[0] == 0)
					s->shape[0] = 1;
			}
			break;
		case K_NKINDS:
			break;
		}
	}
	uint64_t need = 0;
	int exit_code = KLNT_EXIT_OK;
	if (kiln_write_size(t, (uint32_t)n, &need, NULL) == 0)
		exit_code = check_space(cmd, out, need);
	if (!exit_code) {
		g.total = need;
		exit_code = write_out(cmd, out, t, (uint32_t)n, wflags, &g, names != NULL);
	}
	free(names);
	free(t);
	free(kinds);
	return exit_code;
}

const struct klnt_cmd klnt_cmd_gen = {
    .name = "gen",
    .summary = "write a synthetic model file (for trying kiln and klnt bench)",
    .usage = usage,
    .run = run,
};
