/* SPDX-License-Identifier: MIT */
/* Series of files (src/format/series.c): the naming rule of shards. */
#ifndef KILN_FORMAT_SERIES_H
#define KILN_FORMAT_SERIES_H

#include "base/base.h"

/* STEM-NNNNN-of-MMMMM.EXT in new memory (free()), or NULL. */
char *kiln__series_path(const char *stem, size_t stem_len, uint32_t no, uint32_t total,
			const char *ext);

#endif
