/* SPDX-License-Identifier: MIT */
/* kiln_dir_open: the file, then the MMAP source (a read-only shared mapping) or the READ/URING
 * sources (src/read.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "source.h"
#include "sys.h"

void kiln__source_release(struct kiln_dir *dir)
{
	if (dir->map_addr)
		munmap(dir->map_addr, dir->map_len);
	if (dir->owned)
		kiln__owned_free(dir->owned, dir->owned_len);
	if (dir->fd >= 0)
		close(dir->fd);
	dir->map_addr = NULL;
	dir->map_len = 0;
	dir->owned = NULL;
	dir->owned_len = 0;
	dir->fd = -1;
}

static int sys_fail(kiln_error *err, const char *path, const char *what, int e)
{
	return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e, "%s: %s: %s", path, what,
			      strerror(e));
}

int kiln__mlock_fail(kiln_error *err, int e, size_t len)
{
	struct rlimit rl;
	char limit[48] = "unknown";
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		if (rl.rlim_cur == RLIM_INFINITY)
			snprintf(limit, sizeof(limit), "unlimited");
		else
			snprintf(limit, sizeof(limit), "%llu bytes",
				 (unsigned long long)rl.rlim_cur);
	}
	return kiln__fail_sys(err, KILN_IO, e,
			      "mlock of %zu bytes failed: %s; RLIMIT_MEMLOCK is %s (raise it with "
			      "ulimit -l, or grant CAP_IPC_LOCK)",
			      len, strerror(e), limit);
}

/* Open `path` read-only and check it is a regular file. Returns the descriptor or -1. */
int kiln__open_file(const char *path, uint64_t *size, kiln_error *err)
{
	/* O_NONBLOCK: opening a FIFO must not hang waiting for a writer; it is refused below. */
	int fd = kiln__sys.open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		sys_fail(err, path, "cannot open", errno);
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		sys_fail(err, path, "cannot stat", errno);
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		close(fd);
		kiln__fail_sys(err, KILN_IO, e, "%s: not a regular file (%s)", path,
			       S_ISDIR(st.st_mode)    ? "a directory"
			       : S_ISFIFO(st.st_mode) ? "a FIFO"
			       : S_ISCHR(st.st_mode)  ? "a character device"
			       : S_ISBLK(st.st_mode)  ? "a block device"
			       : S_ISSOCK(st.st_mode) ? "a socket"
						      : "not a file");
		return -1;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		close(fd);
		kiln__fail_sys(err, KILN_IO, EFBIG, "%s: too large to map", path);
		return -1;
	}
	/* Regular files ignore O_NONBLOCK for reads, but keep the descriptor plain. */
	fcntl(fd, F_SETFL, 0);
	*size = (uint64_t)st.st_size;
	return fd;
}

static const int advice_of[] = {
    [KILN_ADVICE_NORMAL] = MADV_NORMAL,
    [KILN_ADVICE_SEQUENTIAL] = MADV_SEQUENTIAL,
    [KILN_ADVICE_RANDOM] = MADV_RANDOM,
    [KILN_ADVICE_WILLNEED] = MADV_WILLNEED,
};

/* Fault every page in: MADV_POPULATE_READ where the kernel has it, else one read per page. */
static void populate(const uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_READ
	if (madvise((void *)p, len, MADV_POPULATE_READ) == 0)
		return;
#endif
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < len; i += 4096)
		sink ^= p[i];
	(void)sink;
}

static void prefetch_directory(struct kiln_dir *dir, uint64_t from, uint64_t to)
{
	uintptr_t a = ((uintptr_t)dir->map_addr + from) / 4096 * 4096;
	uintptr_t b = ((uintptr_t)dir->map_addr + to + 4095) / 4096 * 4096;
	madvise((void *)a, b - a, MADV_WILLNEED); /* a hint: failure only costs speed */
}

static int map_source(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		      kiln_error *err)
{
	size_t len = (size_t)dir->len;
	uint32_t flags = opts ? opts->flags : 0;
	if (len > 0) {
		void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, dir->fd, 0);
		if (p == MAP_FAILED)
			return sys_fail(err, path, "cannot map", errno);
		dir->map_addr = p;
		dir->map_len = len;
		/* Validation faults in only the directory pages; without this hint the kernel's
		 * read-around would also pull in the first payload pages around each fault. */
		madvise(p, len, MADV_RANDOM);
		dir->prefetch = prefetch_directory;
	}
	static const uint8_t empty[1];
	dir->base = dir->map_addr ? dir->map_addr : empty;
	int rc = kiln__validate_structure(dir, 1, err);
	dir->prefetch = NULL;
	if (rc || !dir->map_addr)
		return rc;

	/* The caller's hints, only once the file is known to be good. */
	unsigned advice = opts ? opts->advice : KILN_ADVICE_NORMAL;
	if (madvise(dir->map_addr, len, advice_of[advice]) != 0)
		dir->info.advice_errno = errno;
	if ((flags & KILN_OPEN_HUGEPAGE) && madvise(dir->map_addr, len, MADV_HUGEPAGE) != 0)
		dir->info.advice_errno = errno;
	if (flags & KILN_OPEN_LOCK) {
		if (kiln__sys.mlock(dir->map_addr, len) != 0)
			return kiln__mlock_fail(err, errno, len);
	} else if (flags & KILN_OPEN_POPULATE) {
		populate(dir->map_addr, len);
	}
	return 0;
}

int kiln_dir_open(const char *path, const kiln_open_options *opts, kiln_dir **out, kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "out is NULL");
	*out = NULL;
	if (!path)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "path is NULL");
	int rc = kiln__check_options(opts, err);
	if (rc)
		return rc;
	unsigned source = opts ? opts->source : KILN_SOURCE_MMAP;
	if (opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING))
		return kiln__fail(
		    err, KILN_INVAL, KILN_NO_INDEX, "flags", KILN_NO_OFFSET,
		    "KILN_OPEN_ALLOW_TRAILING applies to buffers; a file is one block");
	if (opts && opts->buffer && source == KILN_SOURCE_MMAP)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "buffer", KILN_NO_OFFSET,
				  "a load buffer needs the read or uring source");
	if (source == KILN_SOURCE_BUFFER || source > KILN_SOURCE_URING)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "source", KILN_NO_OFFSET,
				  "source %u cannot open a path (use mmap, read or uring)", source);

	uint64_t size;
	int fd = kiln__open_file(path, &size, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	struct kiln_dir *dir = kiln__dir_new(opts, err);
	if (!dir) {
		close(fd);
		return KILN_NOMEM;
	}
	dir->fd = fd;
	dir->len = size;
	dir->info.source = source;
	if (source == KILN_SOURCE_MMAP)
		rc = map_source(dir, opts, path, err);
	else
		rc = kiln__read_source(dir, opts, path, err);
	if (!rc && opts && (opts->flags & KILN_OPEN_VERIFY_PAYLOAD))
		rc = kiln_dir_verify_payload(dir, err);
	if (rc) {
		kiln_dir_close(dir);
		return rc;
	}
	*out = dir;
	return 0;
}
