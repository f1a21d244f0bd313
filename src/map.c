/* The mmap source: a read-only shared mapping of a whole regular file. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "source.h"

void kiln__source_release(struct kiln_dir *dir)
{
	if (dir->map_addr)
		munmap(dir->map_addr, dir->map_len);
	dir->map_addr = NULL;
	dir->map_len = 0;
}

static int sys_fail(kiln_error *err, const char *path, const char *what, int e)
{
	return kiln__fail_sys(err, e == ENOMEM ? KILN_NOMEM : KILN_IO, e, "%s: %s: %s", path, what,
			      strerror(e));
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
	if (opts && (opts->flags & KILN_OPEN_ALLOW_TRAILING))
		return kiln__fail(
		    err, KILN_INVAL, KILN_NO_INDEX, "flags", KILN_NO_OFFSET,
		    "KILN_OPEN_ALLOW_TRAILING applies to buffers; a file is one block");

	/* O_NONBLOCK: opening a FIFO must not hang waiting for a writer; it is refused below. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return sys_fail(err, path, "cannot open", errno);
	struct stat st;
	if (fstat(fd, &st) != 0) {
		rc = sys_fail(err, path, "cannot stat", errno);
		close(fd);
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		close(fd);
		return kiln__fail_sys(err, KILN_IO, e, "%s: not a regular file (%s)", path,
				      S_ISDIR(st.st_mode)    ? "a directory"
				      : S_ISFIFO(st.st_mode) ? "a FIFO"
				      : S_ISCHR(st.st_mode)  ? "a character device"
				      : S_ISBLK(st.st_mode)  ? "a block device"
				      : S_ISSOCK(st.st_mode) ? "a socket"
							     : "not a file");
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		close(fd);
		return kiln__fail_sys(err, KILN_IO, EFBIG, "%s: too large to map", path);
	}

	struct kiln_dir *dir = kiln__dir_new(opts, err);
	if (!dir) {
		close(fd);
		return KILN_NOMEM;
	}
	dir->info.source = KILN_SOURCE_MMAP;
	size_t len = (size_t)st.st_size;
	if (len > 0) {
		void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			rc = sys_fail(err, path, "cannot map", errno);
			close(fd);
			kiln_dir_close(dir);
			return rc;
		}
		dir->map_addr = p;
		dir->map_len = len;
		/* Validation faults in only the directory pages; without this hint the kernel's
		 * read-around would also pull in the first payload pages around each fault. */
		madvise(p, len, MADV_RANDOM);
	}
	close(fd); /* the mapping keeps the file */
	static const uint8_t empty[1];
	dir->base = dir->map_addr ? dir->map_addr : empty;
	dir->len = len;
	rc = kiln__validate_structure(dir, 1, err);
	if (!rc && dir->map_addr)
		madvise(dir->map_addr, len, MADV_NORMAL);
	if (!rc && opts && (opts->flags & KILN_OPEN_VERIFY_PAYLOAD))
		rc = kiln_dir_verify_payload(dir, err);
	if (rc) {
		kiln_dir_close(dir);
		return rc;
	}
	*out = dir;
	return 0;
}
