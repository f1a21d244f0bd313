/* SPDX-License-Identifier: MIT */
/* Series of files (src/series.c): resolving a model's paths, naming and finding shards. */
#ifndef KILN_SERIES_H
#define KILN_SERIES_H

#include "base/internal.h"

/* The files of a model from what the caller gave: one path that is a series name opens the whole
 * series (unless `one_file`), a list is one whole series in any order or files that are no series
 * at all, kept in order. *out: malloc'ed copies (kiln__paths_free). INVAL for a list that is
 * neither, IO/INVAL from kiln__series_check_alone. */
int kiln__series_resolve(const char *const *paths, uint32_t count, int one_file, char ***out,
			 uint32_t *n, kiln_error *err);

/* INVAL when the directory of STEM holds a shard of the same stem and extension with another
 * total (an earlier series left beside this one): which one is meant cannot be told. */
int kiln__series_check_alone(const char *stem, size_t stem_len, uint32_t total, const char *ext,
			     kiln_error *err);

/* STEM-NNNNN-of-MMMMM.EXT in new memory (free()), or NULL. */
char *kiln__series_path(const char *stem, size_t stem_len, uint32_t no, uint32_t total,
			const char *ext);

void kiln__paths_free(char **p, uint32_t n);

#endif
