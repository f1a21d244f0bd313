/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "base/sys.h"

#include <fcntl.h>
#include <stdlib.h>
#include <liburing.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static int sys_open(const char *path, int flags)
{
	return open(path, flags);
}

static int sys_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	return openat(dirfd, path, flags, mode);
}

static int sys_uring_init(unsigned entries, void *ring)
{
	return io_uring_queue_init(entries, ring, 0);
}

static int sys_uring_result(int res, int fd, uint64_t off, size_t len)
{
	(void)fd;
	(void)off;
	(void)len;
	return res;
}

const char *kiln__env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

uint32_t kiln__online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > (long)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read. */
static uint64_t sys_mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return 0;
	char line[128];
	unsigned long long kib = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib * 1024;
}

const struct kiln__sys kiln__sys_default = {
    .open = sys_open,
    .pread = pread,
    .preadv = preadv,
    .mlock = mlock,
    .mmap = mmap,
    .mem_available = sys_mem_available,
    .uring_init = sys_uring_init,
    .uring_result = sys_uring_result,
    .openat = sys_openat,
    .fsync = fsync,
    .linkat = linkat,
    .renameat = renameat,
};

struct kiln__sys kiln__sys = {
    .open = sys_open,
    .pread = pread,
    .preadv = preadv,
    .mlock = mlock,
    .mmap = mmap,
    .mem_available = sys_mem_available,
    .uring_init = sys_uring_init,
    .uring_result = sys_uring_result,
    .openat = sys_openat,
    .fsync = fsync,
    .linkat = linkat,
    .renameat = renameat,
};
