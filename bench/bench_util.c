/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "bench_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "measure.h"

static char *made[64];
static int nmade;

static void cleanup(void)
{
	for (int i = 0; i < nmade; i++) {
		unlink(made[i]);
		free(made[i]);
	}
	const char *dir = getenv("KILN_BENCH_DIR");
	rmdir(dir ? dir : "bench-files");
}

/* Interrupted (Ctrl-C, a timeout): remove the files, which may be large, then die as asked. Only
 * async-signal-safe calls here. */
static void on_signal(int sig)
{
	for (int i = 0; i < nmade; i++)
		unlink(made[i]);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void die(const char *what, const kiln_error *err)
{
	fprintf(stderr, "bench: %s: %s\n", what, err ? err->message : "failed");
	exit(1);
}

static int zero_fill(void *ctx, uint32_t t, uint64_t off, void *buf, size_t len)
{
	(void)ctx;
	(void)t;
	(void)off;
	memset(buf, 0, len);
	return 0;
}

static void put_le64(FILE *f, uint64_t at, uint64_t v)
{
	uint8_t le[8];
	for (int k = 0; k < 8; k++)
		le[k] = (uint8_t)(v >> (8 * k));
	if (fseek(f, (long)at, SEEK_SET) != 0 || fwrite(le, 1, 8, f) != 8)
		die("patching a benchmark file", NULL);
}

/* Remember a file for removal at exit; the path is owned here from now on. */
static void track(char *path)
{
	if (nmade == 0) {
		atexit(cleanup);
		signal(SIGINT, on_signal);
		signal(SIGTERM, on_signal);
	}
	if (nmade == 64)
		die("too many benchmark files", NULL);
	made[nmade++] = path;
}

static const char *bench_dir(void)
{
	const char *dir = getenv("KILN_BENCH_DIR");
	if (!dir)
		dir = "bench-files";
	mkdir(dir, 0777);
	return dir;
}

/* A growing byte buffer for the stock files' headers. */
struct sbuf {
	char *p;
	size_t len, cap;
};

static void sput(struct sbuf *b, const void *s, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 1 << 16;
		while (cap < b->len + n)
			cap *= 2;
		if (!(b->p = realloc(b->p, cap)))
			die("out of memory", NULL);
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void sputf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sputf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	sput(b, tmp, (size_t)n);
}

static void sput_le(struct sbuf *b, uint64_t v, unsigned bytes)
{
	uint8_t le[8];
	for (unsigned k = 0; k < bytes; k++)
		le[k] = (uint8_t)(v >> (8 * k));
	sput(b, le, bytes);
}

static void write_stock(const char *path, const struct sbuf *head, uint64_t payload)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(head->p, 1, head->len, f) != head->len || fclose(f) != 0)
		die(path, NULL);
	if (truncate(path, (off_t)(head->len + payload)) != 0) /* the payload: zeros, a hole */
		die(path, NULL);
}

/* The per-layer tensors of a transformer, HF's names and llama.cpp's. */
static const struct {
	const char *hf, *gg;
	int rows; /* 0: a 1-D norm vector */
} layer_kinds[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 4},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 4},
    {"mlp.up_proj.weight", "ffn_up.weight", 4},
    {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"self_attn.k_proj.weight", "attn_k.weight", 1},
    {"self_attn.o_proj.weight", "attn_output.weight", 1},
    {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.v_proj.weight", "attn_v.weight", 1},
};
#define NKINDS (sizeof(layer_kinds) / sizeof(layer_kinds[0]))
#define COLS   256 /* small shapes: open cost is the header's */

char *kbu_safetensors_file(uint32_t count)
{
	char *path;
	if (asprintf(&path, "%s/st-%u-%ld.safetensors", bench_dir(), count, (long)getpid()) < 0)
		die("asprintf", NULL);
	struct sbuf b = {0};
	const char *meta = "{\"__metadata__\":{\"format\":\"pt\"}";
	sput(&b, meta, strlen(meta));
	uint64_t at = 0;
	for (uint32_t i = 0; i < count; i++) {
		const char *kind = layer_kinds[i % NKINDS].hf;
		int rows = layer_kinds[i % NKINDS].rows;
		const char *dt = rows ? (i % 2 ? "BF16" : "F16") : "F32";
		uint64_t bytes = rows ? (uint64_t)rows * COLS * 2 : COLS * 4;
		sputf(&b,
		      ",\"model.layers.%u.%s\":{\"dtype\":\"%s\",\"shape\":", i / (uint32_t)NKINDS,
		      kind, dt);
		if (rows)
			sputf(&b, "[%d,%d]", rows, COLS);
		else
			sputf(&b, "[%d]", COLS);
		sputf(&b, ",\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
		      (unsigned long long)(at + bytes));
		at += bytes;
	}
	sput(&b, "}", 1);
	while (b.len % 8) /* the reference pads with spaces */
		sput(&b, " ", 1);
	struct sbuf f = {0};
	sput_le(&f, b.len, 8);
	sput(&f, b.p, b.len);
	write_stock(path, &f, at);
	free(b.p);
	free(f.p);
	track(path);
	return path;
}

static void gstr(struct sbuf *b, const char *s)
{
	sput_le(b, strlen(s), 8);
	sput(b, s, strlen(s));
}

char *kbu_gguf_file(uint32_t count, uint64_t vocab_bytes)
{
	char *path;
	if (asprintf(&path, "%s/gg-%u-%llu-%ld.gguf", bench_dir(), count,
		     (unsigned long long)vocab_bytes, (long)getpid()) < 0)
		die("asprintf", NULL);
	/* A vocabulary of tokens of about 12 bytes each, with an f32 score and an i32 type. */
	uint64_t ntok = vocab_bytes / 20; /* 8-byte length + ~12 bytes a token */
	struct sbuf b = {0};
	sput(&b, "GGUF", 4);
	sput_le(&b, 3, 4);
	sput_le(&b, count, 8);
	sput_le(&b, ntok ? 7 : 4, 8);
	gstr(&b, "general.architecture");
	sput_le(&b, KILN_META_STRING, 4);
	gstr(&b, "llama");
	gstr(&b, "general.name");
	sput_le(&b, KILN_META_STRING, 4);
	gstr(&b, "kiln benchmark");
	gstr(&b, "llama.block_count");
	sput_le(&b, KILN_META_U32, 4);
	sput_le(&b, count / 9, 4);
	gstr(&b, "llama.attention.layer_norm_rms_epsilon");
	sput_le(&b, KILN_META_F32, 4);
	sput_le(&b, 0x3727c5ac, 4);
	if (ntok) {
		gstr(&b, "tokenizer.ggml.tokens");
		sput_le(&b, KILN_META_ARRAY, 4);
		sput_le(&b, KILN_META_STRING, 4);
		sput_le(&b, ntok, 8);
		for (uint64_t i = 0; i < ntok; i++) {
			char tok[32];
			snprintf(tok, sizeof(tok), "\xe2\x96\x81tok%07llu", (unsigned long long)i);
			gstr(&b, tok);
		}
		gstr(&b, "tokenizer.ggml.scores");
		sput_le(&b, KILN_META_ARRAY, 4);
		sput_le(&b, KILN_META_F32, 4);
		sput_le(&b, ntok, 8);
		for (uint64_t i = 0; i < ntok; i++)
			sput_le(&b, 0xbf000000u, 4); /* -0.5 */
		gstr(&b, "tokenizer.ggml.token_type");
		sput_le(&b, KILN_META_ARRAY, 4);
		sput_le(&b, KILN_META_I32, 4);
		sput_le(&b, ntok, 8);
		for (uint64_t i = 0; i < ntok; i++)
			sput_le(&b, 1, 4);
	}
	uint64_t off = 0;
	for (uint32_t i = 0; i < count; i++) {
		int rows = layer_kinds[i % NKINDS].rows;
		char name[96];
		snprintf(name, sizeof(name), "blk.%u.%s", i / (uint32_t)NKINDS,
			 layer_kinds[i % NKINDS].gg);
		gstr(&b, name);
		/* ggml types: f32 norms, Q4_K (144 bytes per 256), Q8_0 (34 per 32), f16 */
		uint32_t type = !rows ? 0 : i % 3 == 0 ? 12 : i % 3 == 1 ? 8 : 1;
		uint64_t bytes = !rows        ? COLS * 4
				 : type == 12 ? (uint64_t)rows * 144
				 : type == 8  ? (uint64_t)rows * COLS / 32 * 34
					      : (uint64_t)rows * COLS * 2;
		sput_le(&b, rows ? 2 : 1, 4);
		sput_le(&b, COLS, 8);
		if (rows)
			sput_le(&b, (uint64_t)rows, 8);
		sput_le(&b, type, 4);
		sput_le(&b, off, 8);
		off += (bytes + 31) / 32 * 32;
	}
	while (b.len % 32) /* the data section at the default alignment */
		sput(&b, "\0", 1);
	write_stock(path, &b, off);
	free(b.p);
	track(path);
	return path;
}

char *kbu_tensors_file(uint32_t count, uint64_t payload, uint64_t sparse_total, int named)
{
	const char *dir = bench_dir();
	char *path;
	if (asprintf(&path, "%s/open-%u-%d-%llu-%llu-%ld.klnt", dir, count, named,
		     (unsigned long long)payload, (unsigned long long)sparse_total,
		     (long)getpid()) < 0)
		die("asprintf", NULL);
	kiln_tensor_spec *t = calloc(count, sizeof(*t));
	char *names = malloc((size_t)count * 24);
	if (!t || !names)
		die("out of memory", NULL);
	uint64_t each = payload / count;
	for (uint32_t i = 0; i < count; i++) {
		char *n = names + (size_t)i * 24;
		int len = snprintf(n, 24, "blk.%u.w", i);
		t[i] = (kiln_tensor_spec){.name = named ? n : NULL,
					  .name_len = named ? (size_t)len : 0,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {each},
					  .read = zero_fill};
	}
	kiln_error err;
	/* Without a digest table: the last tensor may be grown in place below. */
	if (kiln_write_file(path, t, count, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err))
		die(path, &err);
	if (sparse_total) {
		/* Grow the last tensor in place (shape, byte_length, payload_bytes), then extend
		 * the file with a hole. Payload offsets are i * align64(each). */
		struct stat st;
		if (stat(path, &st) != 0)
			die(path, NULL);
		uint64_t last_off = (count - 1) * ((each + 63) / 64 * 64);
		uint64_t payload_base = (uint64_t)st.st_size - (last_off + each);
		uint64_t grown = sparse_total - last_off;
		uint64_t d = 64 + 128ull * (count - 1);
		FILE *f = fopen(path, "r+b");
		if (!f)
			die(path, NULL);
		put_le64(f, d + 40, grown);    /* byte_length */
		put_le64(f, d + 48, grown);    /* shape[0] */
		put_le64(f, 16, sparse_total); /* payload_bytes */
		fclose(f);
		if (truncate(path, (off_t)(payload_base + sparse_total)) != 0)
			die(path, NULL);
		kiln_model *check;
		if (kiln_model_open(path, NULL, &check, &err) != 0)
			die(path, &err);
		kiln_model_close(check);
	}
	free(names);
	free(t);
	track(path);
	return path;
}

/* splitmix64's finaliser: a bijection, so distinct inputs give distinct words. */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Eight payload bytes, none of them zero. */
static uint64_t word(uint64_t key, uint64_t w)
{
	return mix(key + w) | 0x0101010101010101ull;
}

static uint64_t tensor_key(uint64_t seed, uint32_t tensor)
{
	return mix(seed ^ ((uint64_t)tensor << 32));
}

uint8_t kbu_byte(uint64_t seed, uint32_t tensor, uint64_t offset)
{
	uint64_t v = word(tensor_key(seed, tensor), offset >> 3);
	uint8_t b[8];
	memcpy(b, &v, 8);
	return b[offset & 7];
}

void kbu_fill(uint64_t seed, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	uint8_t *p = buf;
	uint64_t key = tensor_key(seed, tensor);
	for (; len && (offset & 7); len--)
		*p++ = kbu_byte(seed, tensor, offset++);
	for (; len >= 8; len -= 8, offset += 8, p += 8) {
		uint64_t v = word(key, offset >> 3);
		memcpy(p, &v, 8);
	}
	for (; len; len--)
		*p++ = kbu_byte(seed, tensor, offset++);
}

static int random_fill(void *ctx, uint32_t t, uint64_t off, void *buf, size_t len)
{
	kbu_fill(*(const uint64_t *)ctx, t, off, buf, len);
	return 0;
}

char *kbu_random_file(uint32_t count, uint64_t block_max, uint64_t seed)
{
	return kbu_random_file_as(count, block_max, seed, 0);
}

char *kbu_random_file_as(uint32_t count, uint64_t block_max, uint64_t seed, int safetensors)
{
	const char *dir = bench_dir();
	char *path;
	if (count == 0 ||
	    asprintf(&path, "%s/load-%u-%llu-%ld.%s", dir, count, (unsigned long long)block_max,
		     (long)getpid(), safetensors ? "safetensors" : "klnt") < 0)
		die("kbu_random_file", NULL);
	kiln_tensor_spec *t = calloc(count, sizeof(*t));
	char *names = malloc((size_t)count * 24);
	double *weight = calloc(count, sizeof(*weight));
	if (!t || !names || !weight)
		die("out of memory", NULL);
	/* Sizes are multiples of 64, so payloads follow each other without gaps. Large tensors
	 * get a provisional 64 bytes until the directory's size is known. */
	uint64_t avg = block_max / count, r = mix(seed ^ 0x5eedull), small_max = avg / 64 / 32;
	double wsum = 0;
	uint32_t nlarge = 0, last_large = 0;
	for (uint32_t i = 0; i < count; i++) {
		char *n = names + (size_t)i * 24;
		int len = snprintf(n, 24, "blk.%u.w", i);
		r = mix(r);
		uint64_t size = 64;
		if (i % 5 == 4) {
			size = 64 * (1 + r % (small_max ? small_max : 1));
		} else {
			weight[i] = 0.75 + 0.5 * (double)(r >> 11) / (double)(1ull << 53);
			wsum += weight[i];
			nlarge++;
			last_large = i;
		}
		t[i] = (kiln_tensor_spec){.name = n,
					  .name_len = (size_t)len,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {size},
					  .read = random_fill,
					  .read_ctx = &seed};
	}
	kiln_error err;
	uint64_t block;
	if (kiln_write_size(t, count, &block, &err))
		die("kiln_write_size", &err);
	uint64_t fixed = block - 64ull * nlarge; /* directory, pad and the small tensors */
	if (nlarge && block_max > fixed + 64ull * nlarge) {
		uint64_t budget = block_max - fixed, left = budget;
		for (uint32_t i = 0; i < count; i++) {
			if (weight[i] == 0)
				continue;
			uint64_t size = (uint64_t)((double)budget * weight[i] / wsum) / 64 * 64;
			if (size < 64)
				size = 64;
			if (i == last_large || size > left)
				size = left / 64 * 64;
			t[i].shape[0] = size;
			left -= size;
		}
	}
	if (kiln_write_size(t, count, &block, &err))
		die("kiln_write_size", &err);
	if (block > block_max)
		die("kbu_random_file: the directory alone exceeds the size asked for", NULL);
	for (uint32_t i = 0; safetensors && i < count; i++)
		t[i].byte_length = t[i].shape[0]; /* u8: one byte an element; safetensors asks */
	if (safetensors ? kiln_safetensors_write_file(path, t, count, NULL, 0, 0, &err)
			: kiln_write_file(path, t, count, 0, &err))
		die(path, &err);
	free(weight);
	free(names);
	free(t);
	track(path);
	return path;
}

#define HUGE_PAGE (2ul << 20)

void *kbu_map(size_t len, int huge, int touch)
{
	size_t rl = (len + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	uint8_t *raw =
	    mmap(NULL, rl + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		die("mmap of benchmark memory failed", NULL);
	/* Trim to a 2 MiB boundary so huge pages can back all of it. */
	uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	munmap(p + rl, (size_t)(raw + HUGE_PAGE - p));
	if (huge)
		madvise(p, rl, MADV_HUGEPAGE);
	if (touch)
		for (size_t i = 0; i < rl; i += 4096)
			p[i] = 0x5a;
	return p;
}

void kbu_unmap(void *p, size_t len)
{
	if (p)
		munmap(p, (len + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
}

int kbu_set_temperature(kb_state *st, const char *path, int cold, long resident_max)
{
	char msg[200];
	long total = 0, left;
	kb_pause(st);
	if (cold) {
		left = kmeasure_evict(path);
		kmeasure_resident(path, &total);
		if (left >= 0 && left <= resident_max) {
			kb_resume(st);
			return 0;
		}
		snprintf(msg, sizeof(msg),
			 "eviction failed: %ld of %ld pages still resident after fsync + "
			 "POSIX_FADV_DONTNEED (tmpfs, or the file mapped elsewhere?)",
			 left, total);
	} else {
		left = kmeasure_resident(path, &total);
		if (left >= 0 && left == total) {
			kb_resume(st);
			return 0;
		}
		left = kmeasure_warm(path);
		if (left == 0) {
			kb_resume(st);
			return 0;
		}
		snprintf(msg, sizeof(msg),
			 "cannot make the file warm: %ld of %ld pages not resident", left, total);
	}
	kb_resume(st);
	kb_skip(st, msg);
	return -1;
}
