/* SPDX-License-Identifier: MIT */
/*
 * Writer -> reader round trips over seeded random tensor lists: every dtype, rank 0 to 8, zero
 * dimensions, named and unnamed, opaque layouts, both quantization schemes. Every view field and
 * every payload byte must come back as given, through memory and through a file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* splitmix64: deterministic per seed, so a failure names a reproducible seed */
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static unsigned below(unsigned n)
{
	return (unsigned)(rnd() % n);
}

static const uint16_t scale_dtypes[] = {KILN_DT_F32,    KILN_DT_F16,    KILN_DT_BF16,
					KILN_DT_F8E4M3, KILN_DT_F8E5M2, KILN_DT_E8M0};
static const char *layouts[] = {"Q4_K", "Q8_0", "\xe2\x88\x91-block", "IQ2_XXS"};

struct list {
	kiln_tensor_spec t[40];
	uint32_t n;
	char names[40][24];
	uint8_t *data[40];
};

static uint64_t fill_shape(kiln_tensor_spec *t, unsigned rank, int allow_zero)
{
	uint64_t count = 1;
	t->rank = (uint8_t)rank;
	for (unsigned k = 0; k < rank; k++) {
		t->shape[k] = 1 + below(rank > 3 ? 2 : 6);
		if (allow_zero && below(12) == 0)
			t->shape[k] = 0;
		count *= t->shape[k];
	}
	return count;
}

static uint8_t *random_bytes(uint64_t len)
{
	uint8_t *p = malloc(len ? len : 1);
	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)rnd();
	return p;
}

static uint64_t bytes_for(unsigned dtype, uint64_t count)
{
	return (count * kiln_dtype_bits(dtype) + 7) / 8;
}

/* Payload for a plain tensor; an odd 4-bit count gets its unused nibble cleared. */
static void set_payload(struct list *l, uint32_t i, uint64_t count)
{
	kiln_tensor_spec *t = &l->t[i];
	uint64_t len = t->byte_length ? t->byte_length : bytes_for(t->dtype, count);
	l->data[i] = random_bytes(len);
	if (kiln_dtype_bits(t->dtype) == 4 && (count & 1))
		l->data[i][len - 1] &= 0x0F;
	t->data = l->data[i];
}

static void make_list(struct list *l)
{
	memset(l, 0, sizeof(*l));
	int named = below(2);
	unsigned want = below(12);
	while (l->n < want && l->n < 37) {
		uint32_t i = l->n;
		kiln_tensor_spec *t = &l->t[i];
		unsigned kind = below(6);
		if (kind == 0) { /* opaque */
			t->dtype = (uint16_t)(4096 + below(32767 - 4096 + 1));
			fill_shape(t, below(9), 1);
			const char *lay = layouts[below(4)];
			t->layout = lay;
			t->layout_len = strlen(lay);
			t->block_size = 1 + below(40);
			t->byte_length = (uint64_t)t->block_size * below(4);
			set_payload(l, i, 0);
			l->n++;
		} else if (kind == 1) { /* quantized + its scale (+ outer) right after it */
			unsigned dt = 1 + below(19);
			unsigned rank = 1 + below(4);
			uint64_t count = fill_shape(t, rank, 1);
			t->dtype = (uint16_t)dt;
			t->quant_scheme = (uint16_t)(1 + below(2));
			t->quant_axis = (uint16_t)below(rank);
			t->group_size = 1 + below(5);
			t->scale_index = i + 1;
			set_payload(l, i, count);
			uint64_t along = t->shape[t->quant_axis];
			uint64_t groups =
			    count ? (count / along) * ((along + t->group_size - 1) / t->group_size)
				  : 0;
			kiln_tensor_spec *s = &l->t[i + 1];
			s->dtype = scale_dtypes[below(6)];
			s->rank = 1;
			s->shape[0] = groups;
			set_payload(l, i + 1, groups);
			l->n += 2;
			if (t->quant_scheme == 2) {
				t->outer_index = i + 2;
				kiln_tensor_spec *o = &l->t[i + 2];
				o->dtype = scale_dtypes[below(6)];
				o->rank = below(2) ? 0 : 1;
				o->shape[0] = o->rank ? 1 : 0;
				set_payload(l, i + 2, 1);
				l->n++;
			}
		} else { /* plain, any dtype and rank */
			t->dtype = (uint16_t)(1 + below(19));
			uint64_t count = fill_shape(t, below(9), 1);
			set_payload(l, i, count);
			l->n++;
		}
	}
	for (uint32_t i = 0; named && i < l->n; i++) {
		int len = snprintf(l->names[i], sizeof(l->names[i]), "blk.%u.w%u", i, below(1000));
		l->t[i].name = l->names[i];
		l->t[i].name_len = (size_t)len;
	}
}

static void free_list(struct list *l)
{
	for (uint32_t i = 0; i < l->n; i++)
		free(l->data[i]);
}

static void compare(const struct list *l, const kiln_model *dir, uint64_t seed)
{
	cr_assert_eq(kiln_model_count(dir), l->n, "seed %llu", (unsigned long long)seed);
	for (uint32_t i = 0; i < l->n; i++) {
		const kiln_tensor_spec *s = &l->t[i];
		const kiln_tensor *v = kiln_model_tensor(dir, i);
		cr_assert_eq(v->index, i);
		cr_assert_eq(v->dtype, s->dtype, "seed %llu tensor %u", (unsigned long long)seed,
			     i);
		cr_assert_eq(v->rank, s->rank);
		cr_assert_eq(memcmp(v->shape, s->shape, sizeof(v->shape)), 0);
		cr_assert_eq(v->name_len, s->name ? s->name_len : 0);
		if (s->name) {
			cr_assert_eq(memcmp(v->name, s->name, s->name_len), 0);
			cr_assert_eq(kiln_model_find(dir, s->name, s->name_len), v);
		} else {
			cr_assert_null(v->name);
		}
		cr_assert_eq(v->quant_scheme, s->quant_scheme);
		if (s->quant_scheme) {
			cr_assert_eq(v->quant_axis, s->quant_axis);
			cr_assert_eq(v->group_size, s->group_size);
			cr_assert_eq(v->scale_index, s->scale_index);
			cr_assert_eq(kiln_tensor_scale(dir, v)->index, s->scale_index);
		} else {
			cr_assert_eq(v->quant_axis, KILN_NONE16);
			cr_assert_eq(v->scale_index, KILN_NO_INDEX);
		}
		cr_assert_eq(v->outer_index,
			     s->quant_scheme == 2 ? (uint64_t)s->outer_index : KILN_NO_INDEX);
		if (s->layout) {
			cr_assert_eq(v->layout_len, s->layout_len);
			cr_assert_eq(memcmp(v->layout, s->layout, s->layout_len), 0);
			cr_assert_eq(v->block_size, s->block_size);
			cr_assert_eq(v->byte_length, s->byte_length);
		} else {
			cr_assert_null(v->layout);
			cr_assert_eq(v->byte_length, bytes_for(s->dtype, v->count));
		}
		cr_assert_eq(v->byte_offset % 64, 0);
		cr_assert_eq(v->file_offset % 64, 0);
		cr_assert_eq(v->file, 0);
		/* The largest power of two up to 4096 dividing the data pointer's address (the
		 * file offset when there is none). */
		uint64_t at = v->data ? (uint64_t)(uintptr_t)v->data : v->file_offset;
		uint32_t align = 1;
		while (align < 4096 && at % (2 * align) == 0)
			align *= 2;
		cr_assert_eq(v->alignment, align, "seed %llu tensor %u: alignment %u, want %u",
			     (unsigned long long)seed, i, v->alignment, align);
		cr_assert_eq(memcmp(v->data, s->data, v->byte_length), 0,
			     "seed %llu tensor %u bytes", (unsigned long long)seed, i);
	}
}

Test(roundtrip, random_lists, .timeout = 120)
{
	int seen_dtype[20] = {0}, seen_rank[9] = {0}, seen_scheme[3] = {0}, opaque = 0, named = 0,
	    zero = 0;
	for (uint64_t seed = 1; seed <= 400; seed++) {
		rng_state = seed;
		struct list l;
		make_list(&l);
		blob b = build(l.t, l.n);
		kiln_model *dir;
		kiln_error err;
		kiln_open_options o = {.flags = KILN_OPEN_VERIFY_PAYLOAD};
		cr_assert_eq(kiln_model_parse(b.p, b.len, &o, &dir, &err), 0, "seed %llu: %s",
			     (unsigned long long)seed, err.message);
		compare(&l, dir, seed);
		kiln_model_close(dir);

		if (seed % 20 == 0) { /* and through a file */
			char *tmp = temp_dir(), *path;
			cr_assert(asprintf(&path, "%s/r.klnt", tmp) > 0);
			cr_assert_eq(kiln_write_file(path, l.t, l.n,
						     KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS,
						     &err),
				     0, "%s", err.message);
			cr_assert_eq(kiln_model_open(path, &o, &dir, &err), 0, "%s", err.message);
			kiln_file_info info;
			cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
			cr_assert_eq(info.size, b.len);
			cr_assert_eq(memcmp(info.base, b.p, b.len), 0, "file and memory differ");
			compare(&l, dir, seed);
			kiln_model_close(dir);
			/* Every loading source gives the same bytes. */
			static const uint32_t src[][2] = {
			    {KILN_SOURCE_READ, 0},
			    {KILN_SOURCE_URING, 0},
			    {KILN_SOURCE_READ, KILN_OPEN_DIRECT},
			    {KILN_SOURCE_URING, KILN_OPEN_DIRECT},
			};
			for (size_t k = 0; k < sizeof(src) / sizeof(src[0]); k++) {
				kiln_open_options so = {.source = src[k][0],
							.flags =
							    src[k][1] | KILN_OPEN_VERIFY_PAYLOAD,
							.chunk_size = 4096};
				cr_assert_eq(kiln_model_open(path, &so, &dir, &err), 0, "%s",
					     err.message);
				cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
				cr_assert_eq(memcmp(info.base, b.p, b.len), 0,
					     "seed %llu source %s", (unsigned long long)seed,
					     kiln_source_name(src[k][0]));
				compare(&l, dir, seed);
				kiln_model_close(dir);
			}
			unlink(path);
			rmdir(tmp);
			free(path);
			free(tmp);
		}
		for (uint32_t i = 0; i < l.n; i++) {
			const kiln_tensor_spec *t = &l.t[i];
			if (kiln_dtype_is_opaque(t->dtype))
				opaque++;
			else
				seen_dtype[t->dtype]++;
			seen_rank[t->rank]++;
			seen_scheme[t->quant_scheme]++;
			named += t->name != NULL;
			for (unsigned k = 0; k < t->rank; k++)
				zero += t->shape[k] == 0;
		}
		blob_free(&b);
		free_list(&l);
	}
	/* The generator really covered what this test claims to cover. */
	for (int d = 1; d <= 19; d++)
		cr_assert_gt(seen_dtype[d], 0, "dtype %d never generated", d);
	for (int r = 0; r <= 8; r++)
		cr_assert_gt(seen_rank[r], 0, "rank %d never generated", r);
	cr_assert_gt(seen_scheme[1], 0);
	cr_assert_gt(seen_scheme[2], 0);
	cr_assert_gt(opaque, 0);
	cr_assert_gt(named, 0);
	cr_assert_gt(zero, 0);
}
