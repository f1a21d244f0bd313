/* SPDX-License-Identifier: MIT */
/*
 * A model.safetensors.index.json (the safetensors convention for sharded checkpoints): a JSON
 * object whose "weight_map" names, for each tensor, the shard file that holds it. Parsed here
 * with the strict JSON reader, every defect located; the resolver (src/model/resolve.c) opens
 * the shards it names, and checks the model against it once open.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "format/safetensors.h"
#include "index/index.h"

static int by_name(const void *a, const void *b)
{
	const struct kiln__st_mapped *x = a, *y = b;
	size_t n = x->len < y->len ? x->len : y->len;
	int c = n ? memcmp(x->name, y->name, n) : 0;
	return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int by_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void kiln__st_index_free(struct kiln__st_index *ix)
{
	for (uint32_t i = 0; ix->shards && i < ix->nshards; i++)
		free(ix->shards[i]);
	free(ix->shards);
	free(ix->map);
	free(ix->text);
	memset(ix, 0, sizeof(*ix));
}

/* An index defect: TYPE (or the JSON reader's class) at byte `at` of the index. */
#define ix_bad(err, code, path, at, ...) \
	kiln__fail_named(err, path, code, KILN_NO_INDEX, "weight_map", at, __VA_ARGS__)

int kiln__st_index_parse(char *text, size_t len, const char *path, kiln__st_shard_check check,
			 void *ctx, struct kiln__st_index *ix, kiln_error *err)
{
	memset(ix, 0, sizeof(*ix));
	ix->text = text;
	size_t b = kiln__utf8_check((const uint8_t *)text, len);
	if (b != SIZE_MAX) {
		ix_bad(err, KILN_UTF8, path, b, "byte %zu is not well-formed UTF-8", b);
		goto fail;
	}
	struct kiln__json j;
	kiln__json_init(&j, text, len, 64);
	struct kiln__json_str key, file;
	size_t map_at = 0;
	int rc = 0;
	if (kiln__json_peek(&j) != KILN__JSON_OBJECT || kiln__json_enter(&j, KILN__JSON_OBJECT)) {
		ix_bad(err, KILN_FRAME, path, j.pos, "the index is not a JSON object");
		goto fail;
	}
	while (kiln__json_member(&j, &key)) {
		if (kiln__json_str_is(&key, "weight_map", 10)) {
			if (map_at) {
				ix_bad(err, KILN_TYPE, path, key.at, "weight_map is given twice");
				goto fail;
			}
			map_at = j.pos;
		} else if (!kiln__json_str_is(&key, "metadata", 8)) {
			ix_bad(err, KILN_TYPE, path, key.at, "unknown index key \"%.*s\"",
			       (int)(key.raw_len < 60 ? key.raw_len : 60), (const char *)key.raw);
			goto fail;
		}
		if (kiln__json_skip(&j))
			break;
	}
	if (j.code || kiln__json_finish(&j)) {
		ix_bad(err, j.code, path, j.at, "byte %zu: %s", j.at, j.what);
		goto fail;
	}
	if (!map_at) {
		ix_bad(err, KILN_TYPE, path, 0, "no weight_map object");
		goto fail;
	}
	/* The weight_map: at most one entry per 6 bytes of it, proven present. */
	j.pos = map_at;
	j.depth = 1;
	if (kiln__json_peek(&j) != KILN__JSON_OBJECT || kiln__json_enter(&j, KILN__JSON_OBJECT)) {
		ix_bad(err, KILN_TYPE, path, map_at, "weight_map is not an object");
		goto fail;
	}
	size_t cap = 0;
	char **files = NULL;
	while (kiln__json_member(&j, &key)) {
		if (kiln__json_peek(&j) != KILN__JSON_STRING || kiln__json_string(&j, &file)) {
			rc = j.code ? ix_bad(err, j.code, path, j.at, "byte %zu: %s", j.at, j.what)
				    : ix_bad(err, KILN_TYPE, path, j.pos,
					     "a weight_map value is not a string");
			break;
		}
		if (ix->nmap == cap) {
			size_t c = cap ? 2 * cap : 64;
			struct kiln__st_mapped *mp = realloc(ix->map, c * sizeof(*mp));
			char **fp = realloc(files, c * sizeof(*fp));
			if (mp)
				ix->map = mp;
			if (fp)
				files = fp;
			if (!mp || !fp) {
				rc = kiln__nomem(err, 0, NULL);
				break;
			}
			cap = c;
		}
		/* Names and file names decoded in place: decoding never lengthens. */
		struct kiln__st_mapped *e = &ix->map[ix->nmap];
		e->name = (char *)key.raw;
		e->len = kiln__json_decode(&key, (uint8_t *)key.raw);
		size_t flen = kiln__json_decode(&file, (uint8_t *)file.raw);
		const char *why = flen ? memchr(file.raw, 0, flen)
					     ? "it holds U+0000"
					     : check((const char *)file.raw, flen, ctx)
				       : "it is empty";
		if (why) {
			char nb[KILN__SHOWN];
			rc = ix_bad(err, KILN_TYPE, path, file.at,
				    "tensor %.*s: shard \"%s\": %s; a shard must be a relative "
				    "path without \"..\" beside the index",
				    (int)(e->len < 60 ? e->len : 60), e->name,
				    kiln__shown(file.raw, flen, nb), why);
			break;
		}
		((char *)file.raw)[flen] = '\0'; /* the closing quote, or past the decoded bytes */
		files[ix->nmap] = (char *)file.raw;
		e->shard = UINT32_MAX;
		ix->nmap++;
	}
	if (!rc && j.code)
		rc = ix_bad(err, j.code, path, j.at, "byte %zu: %s", j.at, j.what);
	if (rc) {
		free(files);
		goto fail;
	}
	/* Shards: each file once, in name order (model-00001-of-... first). */
	char **sorted = malloc((ix->nmap ? ix->nmap : 1) * sizeof(*sorted));
	if (!sorted) {
		free(files);
		kiln__nomem(err, 0, NULL);
		goto fail;
	}
	if (ix->nmap)
		memcpy(sorted, files, ix->nmap * sizeof(*sorted));
	qsort(sorted, ix->nmap, sizeof(*sorted), by_str);
	ix->shards = calloc(ix->nmap ? ix->nmap : 1, sizeof(*ix->shards));
	for (uint64_t i = 0; ix->shards && i < ix->nmap; i++)
		if (i == 0 || strcmp(sorted[i], sorted[i - 1]))
			if (!(ix->shards[ix->nshards++] = strdup(sorted[i])))
				break;
	int oom = !ix->shards || (ix->nshards && !ix->shards[ix->nshards - 1]);
	for (uint64_t i = 0; !oom && i < ix->nmap; i++) {
		char **at = bsearch(&files[i], ix->shards, ix->nshards, sizeof(char *), by_str);
		ix->map[i].shard = (uint32_t)(at - ix->shards);
	}
	free(sorted);
	free(files);
	if (oom) {
		kiln__nomem(err, 0, NULL);
		goto fail;
	}
	if (ix->nshards == 0) {
		ix_bad(err, KILN_TYPE, path, map_at, "the weight_map names no tensor");
		goto fail;
	}
	qsort(ix->map, ix->nmap, sizeof(*ix->map), by_name);
	for (uint64_t i = 1; i < ix->nmap; i++)
		if (!by_name(&ix->map[i - 1], &ix->map[i])) {
			ix_bad(err, KILN_TYPE, path, map_at,
			       "tensor %.*s is in the weight_map twice",
			       (int)(ix->map[i].len < 60 ? ix->map[i].len : 60), ix->map[i].name);
			goto fail;
		}
	return 0;
fail:
	kiln__st_index_free(ix);
	return err ? err->code : KILN_TYPE;
}

int kiln__st_index_check(const struct kiln_model *m, const struct kiln__st_index *ix,
			 const char *path, kiln_error *err)
{
	for (uint64_t i = 0; i < m->count; i++) {
		const kiln_tensor *t = kiln__view(m, i);
		struct kiln__st_mapped want = {.name = (char *)t->name, .len = t->name_len};
		const struct kiln__st_mapped *e =
		    bsearch(&want, ix->map, ix->nmap, sizeof(*ix->map), by_name);
		int n = (int)(t->name_len < 60 ? t->name_len : 60);
		const struct kiln__file *f = &m->files[t->file];
		if (!e)
			return kiln__fail(err, KILN_TYPE, t->index - f->first, "weight_map",
					  KILN_NO_OFFSET,
					  "%s: tensor %.*s of shard %s is not in the "
					  "weight_map",
					  path, n, t->name, ix->shards[t->file]);
		if (e->shard != t->file)
			return kiln__fail(
			    err, KILN_TYPE, t->index - f->first, "weight_map", KILN_NO_OFFSET,
			    "%s: tensor %.*s is in shard %s, but the weight_map says %s", path, n,
			    t->name, ix->shards[t->file], ix->shards[e->shard]);
	}
	if (ix->nmap == m->count)
		return 0;
	for (uint64_t i = 0; i < ix->nmap; i++)
		if (!kiln_model_find(m, ix->map[i].name, ix->map[i].len))
			return kiln__fail(err, KILN_TYPE, KILN_NO_INDEX, "weight_map",
					  KILN_NO_OFFSET,
					  "%s: tensor %.*s: shard %s does not hold it", path,
					  (int)(ix->map[i].len < 60 ? ix->map[i].len : 60),
					  ix->map[i].name, ix->shards[ix->map[i].shard]);
	return 0;
}
