/* How the bytes of a directory arrive and are released (src/map.c). */
#ifndef KILN_SOURCE_H
#define KILN_SOURCE_H

#include "internal.h"

int kiln__check_options(const kiln_open_options *opts, kiln_error *err);
struct kiln_dir *kiln__dir_new(const kiln_open_options *opts, kiln_error *err);
/* Validate dir->base[0, dir->len) and, when asked, its payload. */
int kiln__dir_load(struct kiln_dir *dir, const kiln_open_options *opts, int exact, kiln_error *err);
/* Unmap or free what the source attached to dir; safe when nothing is attached. */
void kiln__source_release(struct kiln_dir *dir);

#endif
