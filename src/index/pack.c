/* SPDX-License-Identifier: MIT */
/*
 * Packed views (KILN_OPEN_PACK_VIEWS). Every tensor's view (kiln_tensor, 184 bytes) is made at
 * open, while the reader validates; for a model of thousands of tensors they are most of what an
 * open keeps in memory (3,000 views: 552 KB, four times a GGUF header). With the flag, once the
 * model is open, each view is kept as its difference from the one before it (neighbours share
 * their dtype, shape and file and differ by small strides in index, name and offsets, so a view
 * takes about 12 bytes), and the views move to address space of their own, where a page takes
 * memory when a view on it is first asked for and is then unpacked whole. The views never move
 * again, so a pointer handed out stays valid; a process that uses a few tensors pays for their
 * pages only, one that uses them all pays a fault and an unpacking a page (docs/benchmarks.md).
 *
 * Code of a view: a 2-bit code per 64-bit word of the view, then the words' differences from the
 * previous view's, each in the fewest of 1, 4 or 8 bytes it fits (code 0: the same word). Every
 * KEY_EVERY-th view is a key, coded against zero, so a page is unpacked from the key before it.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base/base.h"
#include "index/pack.h"

#define WORDS      (sizeof(kiln_tensor) / sizeof(uint64_t))
#define HEAD_BYTES ((WORDS * 2 + 7) / 8)
#define KEY_EVERY  8
#define MAX_CODE   (HEAD_BYTES + WORDS * sizeof(uint64_t))
/* Views of fewer bytes than this stay as they are: a few pages are not worth their faults. */
#define PACK_MIN   ((size_t)16 << 10)

_Static_assert(sizeof(kiln_tensor) % sizeof(uint64_t) == 0, "a view is whole words");
_Static_assert(WORDS <= 32, "a view's word codes fit in 64 bits");

enum { PAGE_PACKED = 0, PAGE_BUSY = 1, PAGE_READY = 2 };

/* What a key view is coded against. */
static const uint64_t zero[WORDS];

struct kiln__packed {
	uint8_t *block; /* malloc'd: the page states, the keys' offsets, the code */
	uint8_t *first; /* the views' own mapping, of `pages` pages */
	size_t pages;
	uint64_t count;
	_Atomic uint8_t *state;
	uint32_t *key_at; /* offset in code of view k * KEY_EVERY */
	const uint8_t *code;
};

static int fits(int64_t d, int64_t lo, int64_t hi)
{
	return d >= lo && d <= hi;
}

static size_t encode(const uint64_t *cur, const uint64_t *prev, uint8_t *out)
{
	uint64_t head = 0;
	uint8_t *p = out + HEAD_BYTES;
	for (size_t w = 0; w < WORDS; w++) {
		uint64_t d = cur[w] - prev[w];
		unsigned c;
		if (!d) {
			c = 0;
		} else if (fits((int64_t)d, INT8_MIN, INT8_MAX)) {
			*p++ = (uint8_t)d;
			c = 1;
		} else if (fits((int64_t)d, INT32_MIN, INT32_MAX)) {
			uint32_t v = (uint32_t)d;
			memcpy(p, &v, 4);
			p += 4;
			c = 2;
		} else {
			memcpy(p, &d, 8);
			p += 8;
			c = 3;
		}
		head |= (uint64_t)c << (2 * w);
	}
	for (size_t k = 0; k < HEAD_BYTES; k++) /* the low bytes first, whatever the host */
		out[k] = (uint8_t)(head >> (8 * k));
	return (size_t)(p - out);
}

static const uint8_t *decode(const uint8_t *in, const uint64_t *prev, uint64_t *cur)
{
	uint64_t head = 0;
	for (size_t k = 0; k < HEAD_BYTES; k++)
		head |= (uint64_t)in[k] << (8 * k);
	const uint8_t *p = in + HEAD_BYTES;
	for (size_t w = 0; w < WORDS; w++, head >>= 2) {
		uint64_t d;
		switch (head & 3) {
		case 0:
			d = 0;
			break;
		case 1:
			d = (uint64_t)(int64_t)(int8_t)*p++;
			break;
		case 2: {
			int32_t v;
			memcpy(&v, p, 4);
			p += 4;
			d = (uint64_t)(int64_t)v;
			break;
		}
		default:
			memcpy(&d, p, 8);
			p += 8;
		}
		cur[w] = prev[w] + d;
	}
	return p;
}

struct kiln__packed *kiln__pack(const kiln_tensor *views, uint64_t n)
{
	size_t P = kiln__page_size();
	if (n > SIZE_MAX / 2 / MAX_CODE || n * sizeof(kiln_tensor) < PACK_MIN)
		return NULL;
	size_t bytes = (size_t)n * sizeof(kiln_tensor), pages = (bytes + P - 1) / P,
	       states = (pages + 7) / 8 * 8, keys = (size_t)((n + KEY_EVERY - 1) / KEY_EVERY);
	size_t head = states + keys * sizeof(uint32_t);
	/* Allocated for the worst case and cut to the code's length: from the allocator, so that
	 * a process opening model after model reuses warm memory. */
	uint8_t *block = malloc(head + (size_t)n * MAX_CODE);
	if (!block)
		return NULL;
	memset(block, 0, states); /* every page packed */
	uint32_t *key_at = (uint32_t *)(block + states);
	uint8_t *code = block + head, *at = code;
	uint64_t words[2][WORDS]; /* a view's words, copied: a view is not an array of words */
	const uint64_t *prev = zero;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t *cur = words[i & 1];
		memcpy(cur, &views[i], sizeof(views[i]));
		if (i % KEY_EVERY == 0) {
			if ((size_t)(at - code) > UINT32_MAX)
				goto give_up;
			key_at[i / KEY_EVERY] = (uint32_t)(at - code);
			prev = zero;
		}
		at += encode(cur, prev, at);
		prev = cur;
	}
	size_t used = (size_t)(at - block);
	/* Packing that saves less than half the views' bytes is not worth a fault per page. */
	if (used > bytes / 2)
		goto give_up;
	uint8_t *shrunk = realloc(block, used);
	if (shrunk)
		block = shrunk;
	/* Fresh address space for the views: a page takes memory once a view on it is used. */
	uint8_t *to = mmap(NULL, pages * P, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (to == MAP_FAILED)
		goto give_up;
	struct kiln__packed *k = malloc(sizeof(*k));
	if (!k) {
		munmap(to, pages * P);
		goto give_up;
	}
	*k = (struct kiln__packed){
	    block,       to, pages, n, (_Atomic uint8_t *)block, (uint32_t *)(block + states),
	    block + head};
	return k;
give_up:
	free(block);
	return NULL;
}

kiln_tensor *kiln__packed_views(const struct kiln__packed *k)
{
	return (kiln_tensor *)k->first;
}

void kiln__packed_free(struct kiln__packed *k)
{
	if (!k)
		return;
	munmap(k->first, k->pages * kiln__page_size());
	free(k->block);
	free(k);
}

/* Write page j of the views from their code: only its own bytes, so that two threads unpacking
 * neighbouring pages never write the same view. */
static void unpack_page(const struct kiln__packed *k, size_t j)
{
	size_t P = kiln__page_size();
	uint8_t *page = k->first + j * P;
	uintptr_t p0 = j * P; /* the views start the mapping */
	uint64_t v_lo = p0 / sizeof(kiln_tensor), v_hi = (p0 + P - 1) / sizeof(kiln_tensor);
	if (v_hi >= k->count)
		v_hi = k->count - 1;
	uint64_t views[2][WORDS];
	const uint64_t *prev = zero;
	uint64_t key = v_lo / KEY_EVERY * KEY_EVERY;
	const uint8_t *in = k->code + k->key_at[key / KEY_EVERY];
	for (uint64_t v = key; v <= v_hi; v++) {
		uint64_t *cur = views[v & 1];
		if (v % KEY_EVERY == 0)
			prev = zero;
		in = decode(in, prev, cur);
		prev = cur;
		if (v < v_lo)
			continue;
		uintptr_t s = (uintptr_t)v * sizeof(kiln_tensor), e = s + sizeof(kiln_tensor);
		uintptr_t from = s > p0 ? s : p0, to = e < p0 + P ? e : p0 + P;
		memcpy(page + (from - p0), (const uint8_t *)cur + (from - s), to - from);
	}
}

static void ready_page(const struct kiln__packed *k, size_t j)
{
	uint8_t s = atomic_load_explicit(&k->state[j], memory_order_acquire);
	if (s == PAGE_READY)
		return;
	uint8_t expect = PAGE_PACKED;
	if (atomic_compare_exchange_strong_explicit(&k->state[j], &expect, PAGE_BUSY,
						    memory_order_acquire, memory_order_acquire)) {
		unpack_page(k, j);
		atomic_store_explicit(&k->state[j], PAGE_READY, memory_order_release);
		return;
	}
	/* Another thread unpacks it: a page of views takes about a microsecond. */
	while (atomic_load_explicit(&k->state[j], memory_order_acquire) != PAGE_READY)
		sched_yield();
}

void kiln__packed_ready(const struct kiln__packed *k, const kiln_tensor *t)
{
	size_t P = kiln__page_size();
	/* Every view lies in the mapping, on one page or across two. */
	size_t s = (size_t)((uintptr_t)t - (uintptr_t)k->first) / P,
	       e = (size_t)((uintptr_t)t + sizeof(*t) - 1 - (uintptr_t)k->first) / P;
	ready_page(k, s);
	if (e != s)
		ready_page(k, e);
}
