/* SPDX-License-Identifier: MIT */
/*
 * Owned memory and its reporting: the page size, page-aligned blocks (transparent huge pages from
 * KILN__HUGE_MIN up), the default index allocator, and the message for a refused mlock. Every
 * other file may use this one; it uses nothing of the library but the error helpers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"

size_t kiln__page_size(void)
{
	/* 4 KiB on x86-64, but 16 or 64 KiB on some arm64 kernels: ask, once. Threads that race
	 * here store the same value. */
	static size_t page;
	size_t p = __atomic_load_n(&page, __ATOMIC_RELAXED);
	if (!p) {
		long v = sysconf(_SC_PAGESIZE);
		p = v > 0 && ((unsigned long)v & ((unsigned long)v - 1)) == 0 ? (size_t)v : 4096;
		__atomic_store_n(&page, p, __ATOMIC_RELAXED);
	}
	return p;
}

static size_t huge_round(size_t size)
{
	return (size + KILN__HUGE_MIN - 1) & ~(KILN__HUGE_MIN - 1);
}

void *kiln__owned_alloc(size_t size)
{
	if (size == 0)
		size = 1;
	if (size < KILN__HUGE_MIN) {
		void *p = NULL;
		return posix_memalign(&p, kiln__page_size(), size) == 0 ? p : NULL;
	}
	/* First touch of fresh 4 KiB pages is slow on VMs; a mapping of its own can get THP. */
	if (size > SIZE_MAX - KILN__HUGE_MIN)
		return NULL;
	size_t len = huge_round(size);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	madvise(p, len, MADV_HUGEPAGE); /* a hint: without it the memory still works */
	return p;
}

void *kiln__owned_reserve(size_t size)
{
	if (size < KILN__HUGE_MIN)
		size = KILN__HUGE_MIN;
	if (size > SIZE_MAX - KILN__HUGE_MIN)
		return NULL;
	/* No commitment: only the pages touched count, so a reservation as large as a file the
	 * machine's memory could not hold is still granted. Huge pages only where the caller
	 * knows they fill (kiln__owned_reserve_huge). */
	void *p = mmap(NULL, huge_round(size), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* Linux 6.1's synchronous collapse (Debian 12's headers predate it). */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

void kiln__owned_reserve_huge(void *p, size_t from, size_t to)
{
	const size_t H = KILN__HUGE_MIN, enough = H - H / 4;
	for (size_t b = from & ~(H - 1); b < to; b += H) {
		if (to - b < enough)
			break; /* the last block, too little of it used */
		uint8_t *q = (uint8_t *)p + b;
		madvise(q, H, MADV_HUGEPAGE); /* hints: without them the memory still works */
		if (from > b) /* bytes there already, in small pages: into one huge page */
			madvise(q, H, MADV_COLLAPSE);
	}
}

void kiln__owned_unreserve(void *p, size_t size)
{
	if (p)
		munmap(p, huge_round(size < KILN__HUGE_MIN ? KILN__HUGE_MIN : size));
}

void *kiln__owned_zalloc(size_t size)
{
	void *p = kiln__owned_alloc(size);
	if (p && size < KILN__HUGE_MIN) /* a mapping of its own is zero already */
		memset(p, 0, size);
	return p;
}

void kiln__owned_free(void *p, size_t size)
{
	if (!p)
		return;
	if (size == 0)
		size = 1;
	if (size < KILN__HUGE_MIN)
		free(p);
	else
		munmap(p, huge_round(size));
}

/* The handle and indexes need no page alignment: malloc, which after the first open of a size
 * keeps it in its heap (glibc raises its mmap threshold to a freed block's size, up to 32 MiB),
 * so repeated opens reuse warm memory instead of faulting and zeroing fresh pages. Indexes past
 * that (hundreds of thousands of tensors) go through kiln__owned_alloc: glibc would map them
 * afresh in 4 KiB pages every time, and first-touch faults cost more than the validation. */
#define MALLOC_MAX ((size_t)32 << 20)

static void *default_alloc(void *ctx, size_t size)
{
	(void)ctx;
	return size < MALLOC_MAX ? malloc(size) : kiln__owned_alloc(size);
}

static void default_free(void *ctx, void *ptr, size_t size)
{
	(void)ctx;
	if (size < MALLOC_MAX)
		free(ptr);
	else
		kiln__owned_free(ptr, size);
}

const kiln_allocator kiln__default_allocator = {default_alloc, default_free, NULL};

void *kiln__alloc(const kiln_allocator *a, size_t size)
{
	return a->alloc(a->ctx, size);
}

void kiln__free(const kiln_allocator *a, void *p, size_t size)
{
	a->free(a->ctx, p, size);
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
