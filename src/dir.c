/* SPDX-License-Identifier: MIT */
/* Directory lifetime, lookup and the parse-a-buffer entry point. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <xxhash.h>

#include "internal.h"
#include "source.h"

/* Large indexes (hundreds of thousands of tensors) get huge pages through kiln__owned_alloc:
 * first-touch faults on fresh 4 KiB pages cost more than the validation itself. */
static void *default_alloc(void *ctx, size_t size)
{
	(void)ctx;
	/* Small ones (the handle, most indexes) need no page alignment: plain malloc. */
	return size < (2u << 20) ? malloc(size) : kiln__owned_alloc(size);
}

static void default_free(void *ctx, void *ptr, size_t size)
{
	(void)ctx;
	kiln__owned_free(ptr, size);
}

void *kiln__alloc(const kiln_allocator *a, size_t size)
{
	return a->alloc(a->ctx, size);
}

void kiln__free(const kiln_allocator *a, void *p, size_t size)
{
	a->free(a->ctx, p, size);
}

uint64_t kiln__name_hash(const struct kiln_dir *dir, const void *name, size_t len)
{
	return XXH3_64bits_withSecret(name, len, dir->secret, sizeof(dir->secret));
}

int kiln__check_options(const kiln_open_options *opts, kiln_error *err)
{
	if (!opts)
		return 0;
	if (opts->size != 0 && opts->size < sizeof(*opts))
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "size", KILN_NO_OFFSET,
				  "kiln_open_options.size %u is smaller than this version's %zu",
				  opts->size, sizeof(*opts));
	const uint32_t known = KILN_OPEN_VERIFY_PAYLOAD | KILN_OPEN_ALLOW_TRAILING |
			       KILN_OPEN_POPULATE | KILN_OPEN_LOCK | KILN_OPEN_HUGEPAGE |
			       KILN_OPEN_DIRECT;
	if (opts->flags & ~known)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "flags", KILN_NO_OFFSET,
				  "unknown open flags 0x%x", opts->flags & ~known);
	if (opts->source > KILN_SOURCE_URING)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "source", KILN_NO_OFFSET,
				  "unknown source %u", opts->source);
	if (opts->advice > KILN_ADVICE_WILLNEED)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "advice", KILN_NO_OFFSET,
				  "unknown advice %u", opts->advice);
	if (opts->chunk_size > (1u << 30))
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "chunk_size", KILN_NO_OFFSET,
				  "chunk_size %u is above 1 GiB", opts->chunk_size);
	if (opts->queue_depth > 4096)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "queue_depth", KILN_NO_OFFSET,
				  "queue_depth %u is above 4096", opts->queue_depth);
	for (size_t i = 0; i < sizeof(opts->reserved) / sizeof(opts->reserved[0]); i++)
		if (opts->reserved[i])
			return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "reserved",
					  KILN_NO_OFFSET,
					  "kiln_open_options.reserved[%zu] is not 0", i);
	const kiln_allocator *a = opts->allocator;
	if (a && (!a->alloc || !a->free))
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "allocator", KILN_NO_OFFSET,
				  "an allocator needs both alloc and free");
	return 0;
}

struct kiln_dir *kiln__dir_new(const kiln_open_options *opts, kiln_error *err)
{
	kiln_allocator a = {default_alloc, default_free, NULL};
	if (opts && opts->allocator)
		a = *opts->allocator;
	struct kiln_dir *dir = a.alloc(a.ctx, sizeof(*dir));
	if (!dir) {
		kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate a directory handle");
		return NULL;
	}
	memset(dir, 0, sizeof(*dir));
	dir->alloc = a;
	dir->fd = -1;
	/* Names come from untrusted files: a per-directory random key keeps an attacker from
	 * choosing names that collide in the table. A short read still leaves a usable key. */
	if (getrandom(dir->secret, sizeof(dir->secret), GRND_NONBLOCK) !=
	    (ssize_t)sizeof(dir->secret)) {
		uint64_t x = (uint64_t)(uintptr_t)dir ^ 0x9E3779B97F4A7C15u;
		for (size_t i = 0; i < sizeof(dir->secret); i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			dir->secret[i] ^= (uint8_t)x;
		}
	}
	return dir;
}

int kiln__dir_load(struct kiln_dir *dir, const kiln_open_options *opts, int exact, kiln_error *err)
{
	int rc = kiln__validate_structure(dir, exact, err);
	if (!rc && opts && (opts->flags & KILN_OPEN_VERIFY_PAYLOAD))
		rc = kiln_dir_verify_payload(dir, err);
	return rc;
}

void kiln_dir_close(kiln_dir *dir)
{
	if (!dir)
		return;
	kiln__pins_release(dir);
	kiln__index_free(dir);
	kiln__source_release(dir);
	kiln_allocator a = dir->alloc;
	a.free(a.ctx, dir, sizeof(*dir));
}

int kiln_dir_parse(const void *buf, size_t len, const kiln_open_options *opts, kiln_dir **out,
		   kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "out is NULL");
	*out = NULL;
	if (!buf && len)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "buf is NULL with a nonzero length");
	int rc = kiln__check_options(opts, err);
	if (rc)
		return rc;
	struct kiln_dir *dir = kiln__dir_new(opts, err);
	if (!dir)
		return KILN_NOMEM;
	static const uint8_t empty[1];
	dir->base = buf ? buf : empty;
	dir->len = len;
	dir->info.source = KILN_SOURCE_BUFFER;
	int exact = !(opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING));
	rc = kiln__dir_load(dir, opts, exact, err);
	if (rc) {
		kiln_dir_close(dir);
		return rc;
	}
	*out = dir;
	return 0;
}

int kiln_validate(const void *buf, size_t len, uint32_t flags, kiln_error *err)
{
	kiln_open_options o = {.size = sizeof(o), .flags = flags};
	kiln_dir *dir;
	int rc = kiln_dir_parse(buf, len, &o, &dir, err);
	kiln_dir_close(dir);
	return rc;
}

int kiln_dir_verify_payload(kiln_dir *dir, kiln_error *err)
{
	kiln__clear_error(err);
	if (!dir)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "dir is NULL");
	/* Atomic: concurrent readers may verify the same directory; the result is the same. */
	if (__atomic_load_n(&dir->info.payload_verified, __ATOMIC_ACQUIRE))
		return 0;
	int rc = kiln__verify_payload(dir, err);
	if (!rc)
		__atomic_store_n(&dir->info.payload_verified, 1, __ATOMIC_RELEASE);
	return rc;
}

const char *kiln_source_name(unsigned source)
{
	static const char *const names[] = {"mmap", "buffer", "read", "uring"};
	return source < sizeof(names) / sizeof(names[0]) ? names[source] : NULL;
}

void kiln_dir_get_info(const kiln_dir *dir, kiln_dir_info *info)
{
	*info = dir->info;
	info->payload_verified = __atomic_load_n(&dir->info.payload_verified, __ATOMIC_ACQUIRE);
}

uint32_t kiln_dir_count(const kiln_dir *dir)
{
	return dir->info.tensor_count;
}

const kiln_tensor *kiln_dir_tensor(const kiln_dir *dir, uint32_t index)
{
	return index < dir->info.tensor_count ? &dir->tensors[index] : NULL;
}

const kiln_tensor *kiln_dir_find(const kiln_dir *dir, const char *name, size_t len)
{
	if (!dir->slot_mask || (!name && len))
		return NULL;
	uint64_t h = kiln__name_hash(dir, name, len);
	for (uint64_t s = h & dir->slot_mask;; s = (s + 1) & dir->slot_mask) {
		uint32_t j = dir->slots[s];
		if (j == KILN_NONE32)
			return NULL;
		const kiln_tensor *t = &dir->tensors[j];
		if (dir->hashes[j] == h && t->name_len == len && memcmp(t->name, name, len) == 0)
			return t;
	}
}

const kiln_tensor *kiln_dir_find_cstr(const kiln_dir *dir, const char *name)
{
	return name ? kiln_dir_find(dir, name, strlen(name)) : NULL;
}

const kiln_tensor *kiln_tensor_scale(const kiln_dir *dir, const kiln_tensor *t)
{
	return t->quant_scheme ? kiln_dir_tensor(dir, t->scale_index) : NULL;
}

const kiln_tensor *kiln_tensor_outer(const kiln_dir *dir, const kiln_tensor *t)
{
	return t->quant_scheme == KILN_QUANT_BLOCK_OUTER ? kiln_dir_tensor(dir, t->outer_index)
							 : NULL;
}
