/* SPDX-License-Identifier: MIT */
/*
 * The one way kiln puts a file in place (src/base/publish.c), for every writer: a KLNT file, a
 * series of them, a safetensors file, the converters' outputs, a cache entry. A file is written
 * beside the file it replaces, invisible until complete (no name at all where O_TMPFILE works,
 * else a hidden unpredictable one), synced, then published: linked or renamed into place, alone
 * or with the other files of its set, and each directory synced once, with one rule for a
 * directory that cannot be synced.
 */
#ifndef KILN_BASE_PUBLISH_H
#define KILN_BASE_PUBLISH_H

#include <sys/stat.h>

#include "base/base.h"

/* Every flag a writer takes (enum kiln_write_flags; kiln_write_atomic() ignores
 * KILN_WRITE_NO_DIGESTS: what it writes is the fill's). */
#define KILN__WRITE_FLAGS (KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS)

/* A file being written. */
struct kiln__pending {
	const char *path; /* as the caller gave it, for messages */
	char *target;     /* the file to replace: path with its symlinks followed (malloc'd) */
	const char *base; /* last component of target */
	char *dir;        /* target's directory (malloc'd) */
	int dirfd;        /* O_PATH descriptor of it, or -1 (a file of a set, sealed) */
	int have_old;     /* something is at target now; old is its stat */
	struct stat old;  /* mode and owner to keep */
	int fd;           /* the new file, open for writing until sealed */
	int anonymous;    /* fd is an O_TMPFILE, with no name until linked */
	char tmp[32];     /* the name the new file has in dirfd before it is published, or "" */
	int sync;         /* fsync the file and its directory (not KILN_WRITE_NO_SYNC) */
	int published;    /* it has its target's name */
	int live;         /* created: kiln__pending_drop has something to release */
	int private_;     /* kiln__pending_create_at: 0600, nothing of an old file kept */
};

/* Resolve `path` (symlinks followed, as editors do; a link someone else planted in a sticky
 * directory refused) and create the new, empty file beside its target: 0 with w->fd to write,
 * or IO/NOMEM naming the path and the step. `flags`: enum kiln_write_flags. Drop *w either way. */
int kiln__pending_create(struct kiln__pending *w, const char *path, uint32_t flags,
			 kiln_error *err);
/* The same for a private file `name` in the open directory `dirfd` (a cache entry): no symlink
 * is followed (one at `name` is replaced, never written through), the file is created 0600
 * whatever the umask, and nothing of a file it replaces is kept. `shown` names it in messages
 * (kept, not copied). */
int kiln__pending_create_at(struct kiln__pending *w, int dirfd, const char *name, const char *shown,
			    uint32_t flags, kiln_error *err);
/* The writer is done with w->fd: fsync it (unless NO_SYNC) and close it, after giving an
 * anonymous file its hidden name when `hide` (a set of many files holds no descriptor open).
 * IO naming the step; the target is untouched. */
int kiln__pending_seal(struct kiln__pending *w, int hide, kiln_error *err);
/* Publish n sealed files in order: each takes its target's name, then every directory they are
 * in is synced once. 0; UNSYNCED when every file is in place but a directory could not be
 * opened or synced (one that cannot be synced and need not be, EINVAL or EROFS, is fine): a
 * crash may still bring the old files back; IO naming the step when a link or rename failed,
 * with how many files are in place. */
int kiln__publish(struct kiln__pending *w, size_t n, kiln_error *err);
/* Close and remove what is left of a file that was not published. Safe on a zeroed struct and
 * twice. */
void kiln__pending_drop(struct kiln__pending *w);

/* write() of every byte, retried on EINTR: 0 or the errno. */
int kiln__write_all(int fd, const void *buf, size_t len);
/* The same at file offset off (pwrite: the file position stays). */
int kiln__pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* A hidden file name nobody can predict: ".kiln-tmp." and 64 random bits in hex. */
void kiln__random_name(char *out, size_t cap);

#endif
