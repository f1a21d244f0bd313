/* SPDX-License-Identifier: MIT */
/* safetensors (src/format/safetensors.c): the dtype table, and its index files
 * (src/format/safetensors_index.c). */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H

#include "base/base.h"

struct kiln__st_dtype {
	const char *name; /* as the header spells it */
	uint16_t dtype;   /* KLNT code */
	uint8_t bits;     /* per element */
	uint8_t block;    /* opaque only: bytes per storage unit */
	uint8_t order;    /* place in the reference's Dtype enum (BOOL 0 ... U64 21) */
};
extern const struct kiln__st_dtype kiln__st_dtypes[];
extern const size_t kiln__st_ndtypes;
/* The entry of a KLNT dtype (and, for the opaque ones, its layout), or NULL. */
const struct kiln__st_dtype *kiln__st_dtype_of(uint16_t dtype, const char *layout,
					       size_t layout_len);

/* A model.safetensors.index.json, parsed: the shards its weight_map names (each once, in name
 * order, relative to the index's directory), and for each tensor the shard the index says. */
struct kiln__st_index {
	char **shards;
	uint32_t nshards;
	/* weight_map entries: tensor name (decoded) -> shard number */
	struct kiln__st_mapped {
		char *name;
		size_t len;
		uint32_t shard;
	} * map;
	uint64_t nmap;
	char *text; /* the file */
};

/* What the opener allows an index to name: NULL when the shard name p[0, len) (decoded, neither
 * empty nor holding U+0000) is one, else why not (a static string). The resolver decides
 * (src/model/resolve.c); the index only names. */
typedef const char *(*kiln__st_shard_check)(const char *p, size_t len, void *ctx);

/* Check and take apart the index text[0, len) read from `path` (a name for messages; kept in
 * ix->text, freed with it): a JSON object with a "weight_map" object of tensor -> shard name
 * that `check` accepts, and a "metadata" member (bookkeeping, not read). */
int kiln__st_index_parse(char *text, size_t len, const char *path, kiln__st_shard_check check,
			 void *ctx, struct kiln__st_index *ix, kiln_error *err);
void kiln__st_index_free(struct kiln__st_index *ix);

/* Every tensor of the model is in the shard the index names, and every weight_map entry is a
 * tensor of the model. TYPE naming the tensor otherwise. */
int kiln__st_index_check(const struct kiln_model *m, const struct kiln__st_index *ix,
			 const char *path, kiln_error *err);

#endif
