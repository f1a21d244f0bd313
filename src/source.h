/* SPDX-License-Identifier: MIT */
/*
 * How the bytes of a file arrive and are released: the MMAP source (src/map.c) and the
 * READ/URING sources (src/read.c). A source knows the block's length and payload_base and
 * nothing else of the format: the lifecycle (src/open.c) validates the directory between a
 * source's attach and finish steps.
 */
#ifndef KILN_SOURCE_H
#define KILN_SOURCE_H

#include "internal.h"

/* MMAP: map the file's dir->len bytes (read-only, or copy-on-write with KILN_OPEN_PRIVATE) and
 * set dir->base. Touches no page. */
int kiln__map_attach(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		     kiln_error *err);
/* MMAP, once the directory is valid: the caller's advice, huge pages, then lock or populate. */
int kiln__map_finish(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err);
/* Unmap; safe when nothing is mapped. */
void kiln__map_release(struct kiln_dir *dir);

/* READ/URING: memory for the whole block (owned, or the caller's load buffer); sets dir->base
 * and dir->head to it, so the directory is read and validated in place. */
int kiln__read_attach(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err);
/* READ/URING, once the directory is valid: the payload region into the block memory. */
int kiln__read_payload(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err);
/* Free owned block memory; safe when there is none (a borrowed buffer is left alone). */
void kiln__read_release(struct kiln_dir *dir);

#endif
