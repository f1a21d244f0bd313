/* SPDX-License-Identifier: MIT */
/*
 * The resolver (src/model/resolve.c): what the caller gave (paths, URLs, a series shard, a
 * model.safetensors.index.json) into the list of files of one model. Every decision about what a
 * name means is made here, once: whether it is a URL (and so never a local file), which format
 * its name says, which siblings a series has, which files an index names and where they are.
 */
#ifndef KILN_MODEL_RESOLVE_H
#define KILN_MODEL_RESOLVE_H

#include "format/safetensors.h"
#include "index/index.h"
#include "net/url.h"

/* One file of the model, as the resolver found it. */
struct kiln__entry {
	char *path;            /* malloc'd; taken over by the model's file */
	int remote;            /* a URL: fetched, never opened as a local file */
	uint32_t named_format; /* the format its name ends in (enum kiln_format), or 0 */
};

struct kiln__resolved {
	struct kiln__entry *files;
	uint32_t n;
	unsigned format;   /* the format every file must have (an index's: safetensors), or 0 */
	const char *index; /* the index the files were named by (the caller's path), or NULL */
	const char *index_shown;         /* as messages show it: the path, or url_shown */
	char url_shown[KILN__URL_SHOWN]; /* an index URL with its credentials left out */
	struct kiln__st_index ix; /* its weight_map, held against the model once it is open */
};

/* The files of the model `paths` name (`count` of them; each checked non-NULL by the caller):
 * an index is the only path of its model and opens the shards its weight_map names, beside it;
 * one path that is a series name opens the whole series (unless KILN_OPEN_ONE_FILE); a list is
 * one whole series in any order, or files that are no series at all, kept in order. INVAL for a
 * list that is neither, an ambiguous series; the index's own errors (IO, LIMIT, its format
 * classes); NOMEM. *r is to be freed either way. */
int kiln__resolve(const char *const *paths, uint32_t count, const kiln_open_options *o,
		  struct kiln__resolved *r, kiln_error *err);

/* The files the index text[0, len) read from `path` names (a URL when `remote`), as an open of
 * the index resolves them: text is taken over (freed with *r, even on failure). For the open
 * and the fuzz target of the policy (fuzz/fuzz_index.c). */
int kiln__resolve_index_text(const char *path, int remote, char *text, size_t len,
			     struct kiln__resolved *r, kiln_error *err);

/* After an open of the files failed with *err about file err->file: say what the caller needs
 * to know of it that only the resolver knows (the shard an index names is missing). */
void kiln__resolve_explain(const struct kiln__resolved *r, int rc, kiln_error *err);

/* Once the files are open: the model holds what the index promised (every tensor in the shard
 * its weight_map says, every entry a tensor). TYPE naming the tensor otherwise; 0 without an
 * index. */
int kiln__resolve_check(const struct kiln__resolved *r, const struct kiln_model *m,
			kiln_error *err);

void kiln__resolved_free(struct kiln__resolved *r);

#endif
