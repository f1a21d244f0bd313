/* SPDX-License-Identifier: MIT */
/* The model's metadata (src/index/meta.c): what format readers add, and the public lookups. */
#ifndef KILN_INDEX_META_H
#define KILN_INDEX_META_H

#include "index/index.h"
#include "base/json.h"

/* Append an entry (its pointers must live until close). A key already there keeps its first
 * value (the shards of a checkpoint repeat theirs); readers refuse duplicates within one file
 * themselves. */
int kiln__meta_add(struct kiln_model *m, const kiln_meta *e, kiln_error *err);
int kiln__meta_add_string(struct kiln_model *m, const char *key, size_t klen, const char *val,
			  size_t vlen, kiln_error *err);

/* Memory for metadata that lives until close (decoded strings, encoded arrays). */
void *kiln__meta_alloc(struct kiln_model *m, size_t n, kiln_error *err);

/* A JSON string's value, decoded into metadata memory when it has escapes, else in place. */
int kiln__meta_json_str(struct kiln__file *f, const struct kiln__json_str *s, const char **out,
			size_t *len, kiln_error *err);

/* The entries are complete (the end of a stock model's open): index them by key. */
int kiln__meta_finish(struct kiln_model *m, kiln_error *err);

void kiln__meta_free(struct kiln_model *m);

/* GGUF's encoding of values (shared with the GGUF reader, which validates it): the bytes an item
 * of `type` takes at p, nested arrays included, within [p, end); 0 when it does not fit. */
uint64_t kiln__meta_span(const uint8_t *p, const uint8_t *end, uint32_t type, int depth);
/* The value of `type` encoded at p, validated and `span` bytes long (as its reader measured it,
 * so an array of a vocabulary's strings is not walked again). */
void kiln__meta_value(const uint8_t *p, uint32_t type, uint64_t span, kiln_value *v);

#endif
