/* SPDX-License-Identifier: MIT */
/*
 * The system calls the loading paths and the file writer make, behind one table so tests can
 * inject faults (short reads, EINTR, EIO on the Nth request, O_DIRECT, io_uring or O_TMPFILE
 * refused, mlock or mmap refused, a directory that cannot be synced) without special kernels or
 * privileges. Production code never changes it.
 */
#ifndef KILN_BASE_SYS_H
#define KILN_BASE_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct kiln__sys {
	int (*open)(const char *path, int flags);
	ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
	/* Buffered reads of neighbouring chunks in one call (src/io/engine.c). */
	ssize_t (*preadv)(int fd, const struct iovec *iov, int iovcnt, off_t off);
	int (*mlock)(const void *addr, size_t len);
	/* mmap of a file (the MMAP source): tests refuse it as a file system without mmap does. */
	void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t off);
	/* MemAvailable in bytes (0: unknown), for KILN_SOURCE_AUTO; tests make memory small. */
	uint64_t (*mem_available)(void);
	/* io_uring_queue_init: 0 or -errno. `ring` is a struct io_uring. */
	int (*uring_init)(unsigned entries, void *ring);
	/* Sees every io_uring completion before kiln does and may rewrite its result. */
	int (*uring_result)(int res, int fd, uint64_t off, size_t len);
	/* The writer (src/base/publish.c): its temporary file, the directory it syncs, and
	 * publishing. */
	int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
	int (*fsync)(int fd);
	int (*linkat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
		      int flags);
	int (*renameat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
};

/* An environment variable's value; NULL when it is unset or empty (as the AWS tools read them).
 * The environment is input like any other: its readers check what they take. */
const char *kiln__env(const char *name);
/* The online CPUs (sysconf), at least 1. */
uint32_t kiln__online_cpus(void);

/* The table in use; tests replace entries and restore kiln__sys_default. */
extern struct kiln__sys kiln__sys;
extern const struct kiln__sys kiln__sys_default;

#endif
