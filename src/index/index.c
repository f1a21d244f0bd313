/* SPDX-License-Identifier: MIT */
/* The index of an open model: views by position over every file, one name table, lookup. No
 * lifecycle here: the format readers fill the index through kiln__index_reserve and
 * kiln__index_insert, and src/model/model.c creates and releases the model. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>
#include <sys/random.h>
/* Inlined from Debian's header: a call into the shared library cost as much as hashing a name. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "index/index.h"

/* Names come from untrusted files: a key the file's author cannot know keeps them from choosing
 * names that collide in a table. One random key per process (getrandom and its ChaCha cost about
 * 0.5 us, which was 3 % of opening a 300-tensor file), varied per table by a counter so no two
 * tables probe alike. A short read still leaves a usable key. */
static uint8_t process_key[KILN__SECRET_SIZE];
static pthread_once_t process_key_once = PTHREAD_ONCE_INIT;

static void process_key_init(void)
{
	if (getrandom(process_key, sizeof(process_key), GRND_NONBLOCK) ==
	    (ssize_t)sizeof(process_key))
		return;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t x = (uint64_t)(uintptr_t)&ts ^ (uint64_t)ts.tv_nsec ^ 0x9E3779B97F4A7C15u;
	for (size_t i = 0; i < sizeof(process_key); i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		process_key[i] ^= (uint8_t)x;
	}
}

void kiln__hash_key(uint8_t key[KILN__SECRET_SIZE])
{
	static uint64_t tables;
	pthread_once(&process_key_once, process_key_init);
	memcpy(key, process_key, KILN__SECRET_SIZE);
	/* splitmix64's finaliser of the table's number, folded into the first word. */
	uint64_t x = __atomic_add_fetch(&tables, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15u;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
	x ^= x >> 31;
	uint64_t w;
	memcpy(&w, key, sizeof(w));
	w ^= x;
	memcpy(key, &w, sizeof(w));
}

uint64_t kiln__name_hash(const uint8_t key[KILN__SECRET_SIZE], const void *name, size_t len)
{
	return XXH3_64bits_withSecret(name, len, key, KILN__SECRET_SIZE);
}

/* One table grows to at least twice its names: expected O(1) probes. Its slot: 0 for empty, else
 * the name hash's top 24 bits above the tensor index + 1 (40 bits), so a probe past another name
 * rarely reads that name's view. */
#define SLOT_INDEX_BITS 40
#define SLOT_INDEX_MASK ((((uint64_t)1) << SLOT_INDEX_BITS) - 1)

static uint64_t tag_of(uint64_t h)
{
	return h >> SLOT_INDEX_BITS << SLOT_INDEX_BITS;
}

/* The slot that holds the name with hash h, or the empty slot where it would go. Expected O(1):
 * the hash's key is one the file's author cannot know, so a file cannot choose colliding names,
 * and the table is at most half full. *probes (when not NULL) counts the slots visited. */
static uint64_t slot_of(const struct kiln_model *m, uint64_t h, const char *name, size_t len,
			uint64_t *probes)
{
	uint64_t tag = tag_of(h);
	for (uint64_t s = h & m->slot_mask;; s = (s + 1) & m->slot_mask) {
		uint64_t e = m->slots[s];
		if (probes)
			++*probes;
		if (e == 0)
			return s;
		if ((e & ~SLOT_INDEX_MASK) != tag)
			continue;
		const kiln_tensor *t = kiln__view(m, (e & SLOT_INDEX_MASK) - 1);
		if (t->name_len == len && kiln__same_bytes(t->name, name, len))
			return s;
	}
}

static void free_block(struct kiln_model *m, void *p, size_t len)
{
	if (p)
		kiln__free(&m->alloc, p, len);
}

/* Slots in the name table: 0 when there is none. */
static uint64_t table_slots(const struct kiln_model *m)
{
	return m->slot_mask ? m->slot_mask + 1 : 0;
}

/* Views and slots live in one allocation: views first (16-byte aligned from the allocator),
 * then the table (until kiln__index_pack parts them). Sizes are below 2^40 entries, so the
 * products fit. */
static size_t index_bytes(uint64_t cap, uint64_t table)
{
	return (size_t)(cap * sizeof(kiln_tensor) + table * sizeof(uint64_t));
}

int kiln__index_reserve(struct kiln_model *m, uint64_t views, uint64_t names, kiln_error *err)
{
	if (views > KILN__MODEL_MAX - m->count)
		return kiln__fail_sys(err, KILN_LIMIT, 0,
				      "a model of more than %" PRIu64 " tensors is more than kiln "
				      "indexes",
				      KILN__MODEL_MAX);
	uint64_t want = m->count + views, named = m->named + names;
	uint64_t table = table_slots(m), new_table = table;
	if (named > new_table / 2) {
		new_table = 2;
		while (new_table < 2 * named)
			new_table *= 2;
	}
	if (want <= m->cap && new_table == table)
		return 0;
	/* A model of one file reserves once, exactly; a series grows by at least half again. */
	uint64_t cap = want;
	if (m->cap && cap < m->cap + m->cap / 2)
		cap = m->cap + m->cap / 2;
	if (cap * sizeof(kiln_tensor) + new_table * sizeof(uint64_t) > SIZE_MAX)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "an index of %" PRIu64 " tensors does not fit in memory",
				      cap);
	size_t total = index_bytes(cap, new_table);
	uint8_t *mem = kiln__alloc(&m->alloc, total);
	if (!mem)
		return kiln__fail_sys(
		    err, KILN_NOMEM, ENOMEM,
		    "cannot allocate %zu bytes for the index of %" PRIu64 " tensors", total, want);
	kiln_tensor *t = (kiln_tensor *)mem;
	uint64_t *slots = (uint64_t *)(mem + (size_t)cap * sizeof(kiln_tensor));
	if (m->count)
		memcpy(t, m->tensors, (size_t)m->count * sizeof(kiln_tensor));
	if (new_table == table && table)
		memcpy(slots, m->slots, (size_t)table * sizeof(uint64_t));
	else
		memset(slots, 0, (size_t)new_table * sizeof(uint64_t));
	free_block(m, m->tensors, index_bytes(m->cap, table));
	m->tensors = t;
	m->cap = cap;
	m->slots = new_table ? slots : NULL;
	m->slot_mask = new_table ? new_table - 1 : 0;
	if (new_table != table) /* a larger table: enter the names again from the views */
		for (uint64_t i = 0; i < m->count; i++) {
			const kiln_tensor *v = &t[i];
			if (!v->name)
				continue;
			uint64_t h = kiln__name_hash(m->secret, v->name, v->name_len);
			m->slots[slot_of(m, h, v->name, v->name_len, NULL)] = tag_of(h) | (i + 1);
		}
	return 0;
}

uint64_t kiln__index_insert(struct kiln_model *m, uint64_t i, const char *name, size_t len)
{
	uint64_t h = kiln__name_hash(m->secret, name, len);
	uint64_t s = slot_of(m, h, name, len, &m->probes);
	if (m->slots[s])
		return (m->slots[s] & SLOT_INDEX_MASK) - 1;
	m->slots[s] = tag_of(h) | (i + 1);
	m->named++;
	return KILN_NO_INDEX;
}

void kiln__index_pack(struct kiln_model *m)
{
	if (m->packed)
		return;
	struct kiln__packed *k = kiln__pack(m->tensors, m->count);
	if (!k)
		return;
	uint64_t table = table_slots(m);
	uint64_t *slots = NULL;
	if (table && !(slots = kiln__alloc(&m->alloc, (size_t)table * sizeof(uint64_t)))) {
		kiln__packed_free(k);
		return;
	}
	if (table)
		memcpy(slots, m->slots, (size_t)table * sizeof(uint64_t));
	free_block(m, m->tensors, index_bytes(m->cap, table));
	m->tensors = kiln__packed_views(k);
	m->cap = m->count;
	m->slots = slots;
	m->packed = k;
}

void kiln__index_free(struct kiln_model *m)
{
	uint64_t table = table_slots(m);
	if (m->packed) { /* the views in their own mapping, the table in its own block */
		kiln__packed_free(m->packed);
		m->packed = NULL;
		if (m->slots)
			kiln__free(&m->alloc, m->slots, (size_t)table * sizeof(uint64_t));
	} else {
		free_block(m, m->tensors, index_bytes(m->cap, table));
	}
	m->tensors = NULL;
	m->cap = 0;
	m->count = 0;
	m->slots = NULL;
	m->slot_mask = 0;
	m->named = 0;
}

const struct kiln__file *kiln__file_of(const struct kiln_model *m, uint64_t index)
{
	/* The last file whose first index is <= index: its range holds it (empty files share
	 * their first index with the next one, and the search passes them). */
	uint32_t lo = 0, hi = m->nfiles;
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (m->files[mid].first <= index)
			lo = mid;
		else
			hi = mid;
	}
	return &m->files[lo];
}

void kiln__index_bind(struct kiln_model *m, const struct kiln__file *f)
{
	const uint8_t *base = f->base;
	for (uint64_t i = 0; i < f->count; i++) {
		kiln_tensor *t = &m->tensors[f->first + i];
		t->data = base ? base + t->file_offset : NULL;
		t->alignment = kiln__align_of(base ? (uint64_t)(uintptr_t)t->data : t->file_offset);
	}
}

uint64_t kiln_model_count(const kiln_model *m)
{
	return m ? m->count : 0;
}

const kiln_tensor *kiln_model_tensor(const kiln_model *m, uint64_t index)
{
	return m && index < m->count ? kiln__view(m, index) : NULL;
}

const kiln_tensor *kiln__tensor_or_fail(const struct kiln_model *m, uint64_t index, kiln_error *err)
{
	if (!m) {
		kiln__fail_inval(err, index, NULL, "model is NULL");
		return NULL;
	}
	const kiln_tensor *t = kiln_model_tensor(m, index);
	if (!t)
		kiln__fail_inval(err, index, NULL,
				 "tensor index %" PRIu64 " is out of range (count %" PRIu64 ")",
				 index, m->count);
	return t;
}

const kiln_tensor *kiln__tensor_fits_or_fail(const struct kiln_model *m, uint64_t index,
					     const void *dst, size_t cap, kiln_error *err)
{
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (t && (cap < t->byte_length || (!dst && t->byte_length))) {
		kiln__fail_inval(err, index, NULL,
				 "tensor %" PRIu64 " has %" PRIu64 " bytes; the buffer holds %zu",
				 index, t->byte_length, dst ? cap : 0);
		return NULL;
	}
	return t;
}

const kiln_tensor *kiln_model_find(const kiln_model *m, const char *name, size_t len)
{
	if (!m || !m->slot_mask || (!name && len))
		return NULL;
	uint64_t e = m->slots[slot_of(m, kiln__name_hash(m->secret, name, len), name, len, NULL)];
	return e ? kiln__view(m, (e & SLOT_INDEX_MASK) - 1) : NULL;
}

const kiln_tensor *kiln_model_find_cstr(const kiln_model *m, const char *name)
{
	return name ? kiln_model_find(m, name, strlen(name)) : NULL;
}

const kiln_tensor *kiln_tensor_scale(const kiln_model *m, const kiln_tensor *t)
{
	return t && t->quant_scheme ? kiln_model_tensor(m, t->scale_index) : NULL;
}

const kiln_tensor *kiln_tensor_outer(const kiln_model *m, const kiln_tensor *t)
{
	return t && t->quant_scheme == KILN_QUANT_BLOCK_OUTER ? kiln_model_tensor(m, t->outer_index)
							      : NULL;
}
