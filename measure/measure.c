/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "measure.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

double kmeasure_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

long kmeasure_resident(const char *path, long *total)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return -1;
	}
	long ps = sysconf(_SC_PAGESIZE);
	size_t len = (size_t)st.st_size, pages = (len + (size_t)ps - 1) / (size_t)ps;
	if (total)
		*total = (long)pages;
	if (len == 0) {
		close(fd);
		return 0;
	}
	void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	unsigned char *vec = malloc(pages);
	long resident = -1;
	if (m != MAP_FAILED && vec && mincore(m, len, vec) == 0) {
		resident = 0;
		for (size_t i = 0; i < pages; i++)
			resident += vec[i] & 1;
	}
	free(vec);
	if (m != MAP_FAILED)
		munmap(m, len);
	return resident;
}

long kmeasure_evict(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	long left = -1;
	if (fsync(fd) == 0) {
		/* DONTNEED skips pages that are locked or under writeback at that instant; a
		 * retry after a short pause catches them. */
		for (int tries = 0; tries < 5; tries++) {
			if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
				break;
			left = kmeasure_resident(path, NULL);
			if (left <= 0)
				break;
			usleep(1000u << tries);
		}
	}
	close(fd);
	return left;
}

int64_t kmeasure_read_file(const char *path, void *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int64_t total = 0;
	ssize_t n;
	while ((n = read(fd, buf, len)) > 0 || (n < 0 && errno == EINTR))
		if (n > 0)
			total += n;
	close(fd);
	return n < 0 ? -1 : total;
}

long kmeasure_warm(const char *path)
{
	size_t len = 4u << 20;
	void *buf = malloc(len);
	int64_t n = buf ? kmeasure_read_file(path, buf, len) : -1;
	free(buf);
	long total, resident = kmeasure_resident(path, &total);
	return n < 0 || resident < 0 ? -1 : total - resident;
}

int kmeasure_disk_reads(const char *path, uint64_t *requests, uint64_t *sectors)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return -1;
	char name[64];
	snprintf(name, sizeof(name), "/sys/dev/block/%u:%u/stat", major(st.st_dev),
		 minor(st.st_dev));
	FILE *f = fopen(name, "r");
	if (!f)
		return -1;
	unsigned long long ios, merges, sect;
	int n = fscanf(f, "%llu %llu %llu", &ios, &merges, &sect);
	fclose(f);
	if (n != 3)
		return -1;
	*requests = ios;
	*sectors = sect;
	return 0;
}

uint32_t kmeasure_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double kmeasure_median(double *v, size_t n)
{
	qsort(v, n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
