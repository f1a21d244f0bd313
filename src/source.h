/* SPDX-License-Identifier: MIT */
/* How the bytes of a directory arrive and are released (src/map.c). */
#ifndef KILN_SOURCE_H
#define KILN_SOURCE_H

#include "internal.h"

int kiln__check_options(const kiln_open_options *opts, kiln_error *err);
struct kiln_dir *kiln__dir_new(const kiln_open_options *opts, kiln_error *err);
/* Validate dir->base[0, dir->len) and, when asked, its payload. */
int kiln__dir_load(struct kiln_dir *dir, const kiln_open_options *opts, int exact, kiln_error *err);
/* Unmap or free what the source attached to dir, close its file; safe when nothing is. */
void kiln__source_release(struct kiln_dir *dir);
/* Open a regular file read-only; -1 with *err filled otherwise. */
int kiln__open_file(const char *path, uint64_t *size, kiln_error *err);
/* The READ/URING sources: header, directory, then the block into owned memory. */
int kiln__read_source(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		      kiln_error *err);
/* IO error for a failed mlock, with the RLIMIT_MEMLOCK limit in the message. */
int kiln__mlock_fail(kiln_error *err, int e, size_t len);

#endif
