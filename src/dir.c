/* SPDX-License-Identifier: MIT */
/* The index of an open directory: views by position, lookup by name, info. No lifecycle here:
 * the validator fills the index (src/validate.c) and src/open.c creates and releases it. */
#include <inttypes.h>
#include <xxhash.h>

#include "internal.h"

uint64_t kiln__name_hash(const struct kiln_dir *dir, const void *name, size_t len)
{
	return XXH3_64bits_withSecret(name, len, dir->secret, sizeof(dir->secret));
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
		kiln__fail(err, KILN_INVAL, index, NULL, KILN_NO_OFFSET, "dir is NULL");
		return NULL;
	}
	const kiln_tensor *t = kiln_dir_tensor(dir, index);
	if (!t)
		kiln__fail(err, KILN_INVAL, index, NULL, KILN_NO_OFFSET,
			   "tensor index %" PRIu32 " is out of range (count %" PRIu32 ")", index,
			   dir->info.tensor_count);
	return t;
}

const kiln_tensor *kiln_dir_find(const kiln_dir *dir, const char *name, size_t len)
{
	if (!dir || !dir->slot_mask || (!name && len))
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
	return t && t->quant_scheme ? kiln_dir_tensor(dir, t->scale_index) : NULL;
}

const kiln_tensor *kiln_tensor_outer(const kiln_dir *dir, const kiln_tensor *t)
{
	return t && t->quant_scheme == KILN_QUANT_BLOCK_OUTER ? kiln_dir_tensor(dir, t->outer_index)
							      : NULL;
}
