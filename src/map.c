/* SPDX-License-Identifier: MIT */
/*
 * The MMAP source: a read-only shared mapping of the file (a copy-on-write private one with
 * KILN_OPEN_PRIVATE), then the caller's advice, huge pages, and lock or populate. Nothing here
 * reads the mapping during open: the directory is validated from a private copy (src/open.c),
 * so a file that shrinks meanwhile cannot raise SIGBUS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/mman.h>

#include "source.h"
#include "sys.h"

int kiln__map_attach(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		     kiln_error *err)
{
	if (dir->len == 0)
		return 0; /* an empty file: validation rejects it with no mapping */
	/* Copy-on-write needs no write access to the file: pages are copied when written. No
	 * reservation, or a model larger than memory could not be mapped (see kiln.h). */
	int cow = opts && (opts->flags & KILN_OPEN_PRIVATE);
	void *p = kiln__sys.mmap(NULL, (size_t)dir->len, cow ? PROT_READ | PROT_WRITE : PROT_READ,
				 cow ? MAP_PRIVATE | MAP_NORESERVE : MAP_SHARED, dir->fd, 0);
	if (p == MAP_FAILED) {
		int e = dir->map_errno = errno;
		return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e,
				      "%s: cannot map: %s", path, strerror(e));
	}
	dir->map_addr = p;
	dir->map_len = (size_t)dir->len;
	dir->base = p;
	return 0;
}

static const int advice_of[] = {
    [KILN_ADVICE_NORMAL] = MADV_NORMAL,
    [KILN_ADVICE_SEQUENTIAL] = MADV_SEQUENTIAL,
    [KILN_ADVICE_RANDOM] = MADV_RANDOM,
    [KILN_ADVICE_WILLNEED] = MADV_WILLNEED,
};

/* Fault every page in: MADV_POPULATE_READ where the kernel has it, else one read per page. Only
 * a kernel without it (EINVAL) gets the loop: any other failure (EFAULT for a file that shrank)
 * would turn into SIGBUS there. */
static void populate(const uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_READ
	if (madvise((void *)p, len, MADV_POPULATE_READ) == 0 || errno != EINVAL)
		return;
#endif
	volatile uint8_t sink = 0;
	size_t page = kiln__page_size();
	for (size_t i = 0; i < len; i += page)
		sink ^= p[i];
	(void)sink;
}

/* KILN_SOURCE_AUTO's evidence: AUTO_WINDOWS windows of AUTO_PAGES pages, evenly spread from the
 * start of the payload to the end of the file (the directory was just read, so its pages say
 * nothing about the payload's). */
#define AUTO_WINDOWS 8
#define AUTO_PAGES   16

/* Whether pages [at, at + n) of the mapping are all in the page cache. */
static int resident(const struct kiln_dir *dir, size_t at, size_t n, unsigned char *vec)
{
	size_t page = kiln__page_size();
	if (mincore((uint8_t *)dir->map_addr + at * page, n * page, vec))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(vec[i] & 1))
			return 0;
	return 1;
}

static int sampled_all_cached(const struct kiln_dir *dir)
{
	size_t page = kiln__page_size();
	size_t first = (size_t)dir->info.payload_base / page,
	       pages = (dir->map_len + page - 1) / page;
	if (first >= pages)
		first = 0;
	size_t span = pages - first;
	unsigned char vec[AUTO_WINDOWS * AUTO_PAGES];
	if (span <= sizeof(vec)) /* a small file: every page, in one call */
		return resident(dir, first, span, vec);
	/* Windows from the payload's first pages to the file's last ones, evenly apart. */
	for (size_t w = 0; w < AUTO_WINDOWS; w++)
		if (!resident(dir, first + (span - AUTO_PAGES) * w / (AUTO_WINDOWS - 1), AUTO_PAGES,
			      vec))
			return 0;
	return 1;
}

/* KILN_SOURCE_AUTO on a mapped file: whether to populate it. */
static uint32_t auto_flags(struct kiln_dir *dir, uint32_t flags)
{
	dir->auto_pending = 0;
	if (sampled_all_cached(dir)) {
		/* Mapping cached pages at open reads nothing from the disk and, on the large folios
		 * a read from disk leaves, beats faulting them in later by 3x (warm 1 GiB: 1.9 ms
		 * against 5-6 ms); on a file just written (small folios) touching ran faster
		 * (8.3 against 10.8 ms for 256 MiB), which no cheap evidence here can tell. */
		dir->info.auto_choice = KILN_AUTO_CACHED;
		return flags | KILN_OPEN_POPULATE;
	}
	uint64_t avail = kiln__sys.mem_available();
	if (avail && (uint64_t)dir->map_len > avail / 2) {
		dir->info.auto_choice = KILN_AUTO_LARGE;
		return flags;
	}
	dir->info.auto_choice = KILN_AUTO_COLD;
	return flags | KILN_OPEN_POPULATE;
}

int kiln__map_finish(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err)
{
	if (!dir->map_addr)
		return 0;
	uint32_t flags = opts ? opts->flags : 0;
	if (dir->auto_pending)
		flags = auto_flags(dir, flags);
	unsigned advice = opts ? opts->advice : KILN_ADVICE_NORMAL;
	/* NORMAL is what a new mapping has: no call needed. */
	if (advice != KILN_ADVICE_NORMAL && madvise(dir->map_addr, dir->map_len, advice_of[advice]))
		dir->info.advice_errno = errno;
	if ((flags & KILN_OPEN_HUGEPAGE) && madvise(dir->map_addr, dir->map_len, MADV_HUGEPAGE))
		dir->info.advice_errno = errno;
	if (flags & KILN_OPEN_LOCK) {
		if (kiln__sys.mlock(dir->map_addr, dir->map_len) != 0)
			return kiln__mlock_fail(err, errno, dir->map_len);
	} else if (flags & KILN_OPEN_POPULATE) {
		populate(dir->map_addr, dir->map_len);
	}
	return 0;
}

void kiln__map_release(struct kiln_dir *dir)
{
	if (dir->map_addr)
		munmap(dir->map_addr, dir->map_len);
	dir->map_addr = NULL;
	dir->map_len = 0;
}
