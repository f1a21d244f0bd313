/* SPDX-License-Identifier: MIT */
/* The index of an open directory: views by position, lookup by name, info. No lifecycle here:
 * the validator fills the index through kiln__index_alloc and kiln__index_insert, and
 * src/open.c creates and releases the directory. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <time.h>
#include <sys/random.h>
/* Inlined from Debian's header: a call into the shared library cost as much as hashing a name. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

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

static uint64_t name_hash(const struct kiln_dir *dir, const void *name, size_t len)
{
	return kiln__name_hash(dir->secret, name, len);
}

/* One allocation for views, the name table (at most half full) and the layout name offsets the
 * validator keeps between its descriptor and after-descriptor steps. */
int kiln__index_alloc(struct kiln_dir *dir, kiln_error *err)
{
	uint64_t n = dir->info.tensor_count;
	if (n == 0)
		return 0;
	size_t table = 0;
	if (dir->info.flags & KILN_FLAG_NAMES) {
		/* Names start below heap offset 0xFFFF and are at least a byte long, so at most
		 * KILN__NAMED_MAX of them can validate, whatever tensor_count says. */
		uint64_t names = n < KILN__NAMED_MAX ? n : KILN__NAMED_MAX;
		table = 2;
		while (table < 2 * names)
			table *= 2;
	}
	size_t views = (size_t)n * sizeof(kiln_tensor);
	size_t slots = table * sizeof(uint32_t);
	size_t total = views + slots + (size_t)n * sizeof(uint16_t);
	uint8_t *mem = kiln__alloc(&dir->alloc, total);
	if (!mem)
		return kiln__fail_sys(
		    err, KILN_NOMEM, 12,
		    "cannot allocate %zu bytes for the index of %" PRIu64 " tensors", total, n);
	dir->index_mem = mem;
	dir->index_bytes = total;
	dir->tensors = (kiln_tensor *)mem;
	dir->layout_off = (uint16_t *)(mem + views + slots);
	if (table) {
		dir->slots = (uint32_t *)(mem + views);
		memset(dir->slots, 0xFF, slots);
		dir->slot_mask = table - 1;
	}
	return 0;
}

void kiln__index_free(struct kiln_dir *dir)
{
	if (dir->index_mem)
		kiln__free(&dir->alloc, dir->index_mem, dir->index_bytes);
	dir->index_mem = NULL;
	dir->index_bytes = 0;
	dir->tensors = NULL;
	dir->layout_off = NULL;
	dir->slots = NULL;
	dir->slot_mask = 0;
}

/* The slot that holds the name with hash h, or the empty slot where it would go. Expected O(1):
 * the hash's key is one the file's author cannot know, so a file cannot choose colliding names,
 * and the table is at most half full. A slot is 32 bits, the hash's top 16 above the tensor
 * index (below KILN__NAMED_MAX), so the table of a few thousand names stays in L1 and a probe
 * past another name rarely reads that name's view. *probes (when not NULL) counts the slots
 * visited. */
static uint64_t slot_of(const struct kiln_dir *dir, uint64_t h, const char *name, size_t len,
			uint64_t *probes)
{
	uint32_t tag = (uint32_t)(h >> 48);
	for (uint64_t s = h & dir->slot_mask;; s = (s + 1) & dir->slot_mask) {
		uint32_t e = dir->slots[s];
		if (probes)
			++*probes;
		if (e == KILN__SLOT_EMPTY)
			return s;
		const kiln_tensor *t = &dir->tensors[e & 0xFFFF];
		if (e >> 16 == tag && t->name_len == len && kiln__same_bytes(t->name, name, len))
			return s;
	}
}

uint32_t kiln__index_insert(struct kiln_dir *dir, uint32_t i, const char *name, size_t len)
{
	uint64_t h = name_hash(dir, name, len);
	uint64_t s = slot_of(dir, h, name, len, &dir->probes);
	if (dir->slots[s] != KILN__SLOT_EMPTY)
		return dir->slots[s] & 0xFFFF;
	dir->slots[s] = (uint32_t)(h >> 48) << 16 | i;
	return KILN_NO_INDEX;
}

const char *kiln_source_name(unsigned source)
{
	static const char *const names[] = {"mmap", "buffer", "read", "uring", "auto"};
	return source < sizeof(names) / sizeof(names[0]) ? names[source] : NULL;
}

void kiln_dir_get_info(const kiln_dir *dir, kiln_dir_info *info)
{
	if (!info)
		return;
	if (!dir) {
		memset(info, 0, sizeof(*info));
		return;
	}
	*info = dir->info;
	/* Written by kiln_dir_verify_payload, which may run concurrently: read it atomically. */
	info->payload_verified = (uint8_t)__atomic_load_n(&dir->verified, __ATOMIC_ACQUIRE);
}

uint32_t kiln_dir_count(const kiln_dir *dir)
{
	return dir ? dir->info.tensor_count : 0;
}

const kiln_tensor *kiln_dir_tensor(const kiln_dir *dir, uint32_t index)
{
	return dir && index < dir->info.tensor_count ? &dir->tensors[index] : NULL;
}

const kiln_tensor *kiln__tensor_or_fail(const kiln_dir *dir, uint32_t index, kiln_error *err)
{
	if (!dir) {
		kiln__fail_inval(err, index, NULL, "dir is NULL");
		return NULL;
	}
	const kiln_tensor *t = kiln_dir_tensor(dir, index);
	if (!t)
		kiln__fail_inval(err, index, NULL,
				 "tensor index %" PRIu32 " is out of range (count %" PRIu32 ")",
				 index, dir->info.tensor_count);
	return t;
}

const kiln_tensor *kiln_dir_find(const kiln_dir *dir, const char *name, size_t len)
{
	if (!dir || !dir->slot_mask || (!name && len))
		return NULL;
	uint32_t e = dir->slots[slot_of(dir, name_hash(dir, name, len), name, len, NULL)];
	return e == KILN__SLOT_EMPTY ? NULL : &dir->tensors[e & 0xFFFF];
}

const kiln_tensor *kiln_dir_find_cstr(const kiln_dir *dir, const char *name)
{
	return name ? kiln_dir_find(dir, name, strlen(name)) : NULL;
}

const kiln_tensor *kiln_tensor_scale(const kiln_dir *dir, const kiln_tensor *t)
{
	return t && t->quant_scheme ? kiln_dir_tensor(dir, t->scale_index) : NULL;
}

const kiln_tensor *kiln_tensor_outer(const kiln_dir *dir, const kiln_tensor *t)
{
	return t && t->quant_scheme == KILN_QUANT_BLOCK_OUTER ? kiln_dir_tensor(dir, t->outer_index)
							      : NULL;
}
