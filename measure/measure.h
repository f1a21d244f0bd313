/* SPDX-License-Identifier: MIT */
/*
 * Measurement helpers shared by `klnt bench` (tools/) and the benchmarks (bench/): a clock,
 * page-cache residency, eviction and warming of a file, and the plain sequential read that both
 * use as their baseline. Plain POSIX; nothing here uses kiln.
 */
#ifndef KILN_MEASURE_H
#define KILN_MEASURE_H

#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in seconds. */
double kmeasure_now(void);

/*
 * Page-cache residency of a file, by mincore() on a temporary read-only mapping (mapping faults
 * nothing in): returns the resident page count and sets *total (when not NULL) to the file's page
 * count; -1 on error.
 */
long kmeasure_resident(const char *path, long *total);

/*
 * Drop a file's pages from the page cache: fsync (so no page is dirty), then
 * posix_fadvise(POSIX_FADV_DONTNEED), retried a few times while pages remain. Returns the pages
 * still resident after that (checked with mincore), or -1 on error. The file must not be mapped
 * by anyone: mapped pages are not dropped. In a VM the host may still cache what the guest
 * dropped.
 */
long kmeasure_evict(const char *path);

/* Read the whole file so it is cached. Returns the pages still not resident (0: all warm), or -1.
 */
long kmeasure_warm(const char *path);

/*
 * The plain baseline: open `path` and read() it from start to end through buf[0, len), retrying
 * EINTR. Returns the bytes read, or -1 when the file cannot be opened or a read fails.
 */
int64_t kmeasure_read_file(const char *path, void *buf, size_t len);

/*
 * The read counters of the block device holding `path` (/sys/dev/block/MAJOR:MINOR/stat: a
 * partition's own): reads completed and 512-byte sectors read since boot. 0, or -1 where the
 * file's device has no such counters (tmpfs, overlayfs).
 */
int kmeasure_disk_reads(const char *path, uint64_t *requests, uint64_t *sectors);

/* The median of v[0, n) (n > 0); sorts v. */
double kmeasure_median(double *v, size_t n);

/* The thread count the -threads rows load with: one per online CPU, 1 to 64 (the most
 * kiln_open_options.threads takes). */
uint32_t kmeasure_threads(void);

#endif
