/* SPDX-License-Identifier: MIT */
/*
 * Publishing a file (src/base/publish.h), the one routine under every writer. The new file is
 * built where its target lives, so that rename() can swap it in atomically, and it stays
 * invisible until it is complete:
 *
 * 1. resolve: follow a symlink at `path` to the file it names (the link stays a link), note the
 *    mode and owner of the file being replaced;
 * 2. create: an O_TMPFILE in that directory, which has no name at all (a crash or kill leaves
 *    nothing behind); where the file system refuses O_TMPFILE, a file with a random name;
 * 3. the writer fills it; seal: fsync, and close (an anonymous file that must not hold its
 *    descriptor, one of a set, gets a random hidden name first);
 * 4. publish: link an anonymous file to the target name when nothing is there, else to a random
 *    name that rename() then moves over the target; a hidden one is renamed; a set goes in
 *    order;
 * 5. fsync each directory once, so the new names survive a crash.
 *
 * Any failure up to the rename leaves the target untouched and removes the temporary file. A
 * failure in step 5 is UNSYNCED: the new files are in place, but a crash may still bring back
 * the old ones.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/publish.h"
#include "base/sys.h"

#define SYMLINK_HOPS 40 /* the kernel's own limit (MAXSYMLINKS) */

/* "PATH: STEP: strerror" with errno kept: the step says what had or had not happened. */
static int step_fail(kiln_error *err, const struct kiln__pending *w, int code, int e,
		     const char *step)
{
	return kiln__fail_sys(err, code, e, "%s: %s: %s", w->path, step, strerror(e));
}

/* readlink() into a fresh string. */
static char *read_link(const char *path, size_t hint)
{
	for (size_t cap = hint + 2 > 128 ? hint + 2 : 128;; cap *= 2) {
		char *buf = malloc(cap);
		if (!buf)
			return NULL;
		ssize_t n = readlink(path, buf, cap);
		if (n >= 0 && (size_t)n < cap) {
			buf[n] = '\0';
			return buf;
		}
		free(buf);
		if (n < 0 || cap > (1u << 20))
			return NULL;
	}
}

/* The kernel's protected_symlinks rule: in a sticky world-writable directory (/tmp), a symlink
 * is followed only when it belongs to the caller or to the directory's owner. Following links
 * here, in user space, bypasses the kernel's check, so it is made again: otherwise anyone could
 * plant /tmp/model.klnt -> ~victim/.bashrc. */
static int link_is_untrusted(const char *link, const struct stat *lst)
{
	const char *slash = strrchr(link, '/');
	char *dir = slash ? strndup(link, (size_t)(slash - link) + 1) : strdup(".");
	struct stat dst;
	int sticky =
	    dir && stat(dir, &dst) == 0 && (dst.st_mode & S_ISVTX) && (dst.st_mode & S_IWOTH);
	free(dir);
	return sticky && lst->st_uid != geteuid() && lst->st_uid != dst.st_uid;
}

/* The target's directory, O_PATH (no read permission needed, so a writable but unreadable
 * directory still works): held from create to seal; a file sealed hidden, one of a set that may
 * be thousands, holds none and opens it again to be published. -1 with errno. */
static int dir_fd(struct kiln__pending *w)
{
	if (w->dirfd < 0 && w->private_) { /* known by its descriptor only, never by a path */
		errno = EBADF;
		return -1;
	}
	if (w->dirfd < 0)
		w->dirfd = open(w->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	return w->dirfd;
}

static void dir_done(struct kiln__pending *w)
{
	if (w->dirfd >= 0)
		close(w->dirfd);
	w->dirfd = -1;
}

/* Follow symlinks at the last component of w->path, as open() would, so the new file replaces
 * what the link points to. A dangling link names the file to create. */
static int resolve_target(struct kiln__pending *w, kiln_error *err)
{
	char *cur = strdup(w->path);
	if (!cur)
		return kiln__nomem(err, 0, NULL);
	for (int hops = 0;; hops++) {
		if (lstat(cur, &w->old) != 0) {
			if (errno != ENOENT) {
				free(cur);
				return step_fail(err, w, KILN_IO, errno,
						 "cannot look at the target");
			}
			break;
		}
		if (!S_ISLNK(w->old.st_mode)) {
			w->have_old = 1;
			break;
		}
		if (link_is_untrusted(cur, &w->old)) {
			free(cur);
			return step_fail(err, w, KILN_IO, EACCES,
					 "not following a symlink that someone else owns in a "
					 "sticky directory");
		}
		char *link = hops < SYMLINK_HOPS ? read_link(cur, (size_t)w->old.st_size) : NULL;
		if (!link) {
			int e = hops < SYMLINK_HOPS ? errno : ELOOP;
			free(cur);
			return step_fail(err, w, e == ENOMEM ? KILN_NOMEM : KILN_IO, e,
					 "cannot follow the symlink");
		}
		const char *slash = strrchr(cur, '/');
		char *next = NULL;
		if (link[0] == '/' || !slash)
			next = link, link = NULL;
		else if (asprintf(&next, "%.*s/%s", (int)(slash - cur), cur, link) < 0)
			next = NULL;
		free(link);
		free(cur);
		if (!next)
			return kiln__nomem(err, 0, NULL);
		cur = next;
	}
	w->target = cur;
	/* rename() would fail over a directory, and replace a device or FIFO by a file, which is
	 * never what writing a model file means. */
	const char *slash = strrchr(cur, '/');
	w->base = slash ? slash + 1 : cur;
	if (w->have_old && !S_ISREG(w->old.st_mode))
		return step_fail(err, w, KILN_IO, S_ISDIR(w->old.st_mode) ? EISDIR : EINVAL,
				 "not a regular file, not replacing it");
	if (!*w->base)
		return step_fail(err, w, KILN_IO, EISDIR, "names a directory");
	char *dir = slash ? strndup(cur, (size_t)(slash - cur) + 1) : strdup(".");
	if (!dir)
		return kiln__nomem(err, 0, NULL);
	w->dir = dir;
	if (dir_fd(w) < 0)
		return step_fail(err, w, KILN_IO, errno, "cannot open its directory");
	return 0;
}

/* ".kiln-tmp." and 16 random hex digits: names nobody can predict, so nobody can block a write
 * by creating them first. */
void kiln__random_name(char *out, size_t cap)
{
	static unsigned serial;
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		/* No entropy yet (early boot): O_EXCL only needs unique names. */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
		    ((uint64_t)getpid() << 40) ^ (uintptr_t)&r ^
		    __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
		r = (r ^ (r >> 31)) * 0xBF58476D1CE4E5B9ull; /* splitmix64's finalizer */
		r ^= r >> 29;
	}
	snprintf(out, cap, ".kiln-tmp.%016" PRIx64, r);
}

/* Linking an O_TMPFILE by name goes through /proc/self/fd (AT_EMPTY_PATH would need
 * CAP_DAC_READ_SEARCH); without /proc the file could be written but never linked. */
static int can_link_anonymous(void)
{
	return access("/proc/self/fd", X_OK) == 0;
}

/* Give the new file the mode and owner of the file it replaces. Changing the owner needs
 * privilege: without it (EPERM) the group alone is tried, then the file stays ours. The owner goes
 * first because chown() clears set-user-ID bits that the mode then restores. */
static int keep_mode_and_owner(struct kiln__pending *w, kiln_error *err)
{
	if (fchown(w->fd, w->old.st_uid, w->old.st_gid) != 0 && errno == EPERM)
		(void)fchown(w->fd, (uid_t)-1, w->old.st_gid);
	if (fchmod(w->fd, w->old.st_mode & 07777) != 0)
		return step_fail(err, w, KILN_IO, errno, "cannot set the mode of the new file");
	return 0;
}

static int create_temp(struct kiln__pending *w, kiln_error *err)
{
	/* New files get 0666 & ~umask like any other; a replacement starts out no more open than
	 * its predecessor, before a byte is written. */
	mode_t mode = w->private_ ? 0600 : w->have_old ? (w->old.st_mode & 0777) : 0666;
	int e = EOPNOTSUPP;
	if (can_link_anonymous()) {
		w->fd = kiln__sys.openat(w->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
		w->anonymous = w->fd >= 0;
		e = errno;
	}
	/* Kernels and file systems without O_TMPFILE say so in one of these ways. */
	if (w->fd < 0 && (e == EOPNOTSUPP || e == EISDIR || e == EINVAL)) {
		for (int attempt = 0; attempt < 16 && w->fd < 0; attempt++) {
			kiln__random_name(w->tmp, sizeof(w->tmp));
			w->fd = kiln__sys.openat(w->dirfd, w->tmp,
						 O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
			e = errno;
			if (w->fd < 0 && e != EEXIST)
				break;
		}
		if (w->fd < 0)
			w->tmp[0] = '\0';
	}
	if (w->fd < 0)
		return step_fail(err, w, KILN_IO, e, "cannot create a temporary file");
	if (w->private_) /* the umask may have taken more: never less than 0600, never more */
		return fchmod(w->fd, 0600) ? step_fail(err, w, KILN_IO, errno,
						       "cannot set the mode of the new file")
					   : 0;
	return w->have_old ? keep_mode_and_owner(w, err) : 0;
}

int kiln__write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *b = buf;
	while (len) {
		ssize_t w = write(fd, b, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		b += w;
		len -= (size_t)w;
	}
	return 0;
}

int kiln__pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *b = buf;
	while (len) {
		ssize_t w = pwrite(fd, b, len, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		b += w;
		off += (uint64_t)w;
		len -= (size_t)w;
	}
	return 0;
}

/* Link an anonymous file to a random hidden name beside its target. */
static int link_hidden(struct kiln__pending *w, const char *proc, kiln_error *err)
{
	int e = EEXIST;
	for (int attempt = 0; attempt < 16 && e == EEXIST; attempt++) {
		kiln__random_name(w->tmp, sizeof(w->tmp));
		e = kiln__sys.linkat(AT_FDCWD, proc, w->dirfd, w->tmp, AT_SYMLINK_FOLLOW) ? errno
											  : 0;
	}
	if (e) {
		w->tmp[0] = '\0';
		return step_fail(err, w, KILN_IO, e, "cannot link the new file");
	}
	return 0;
}

int kiln__pending_create(struct kiln__pending *w, const char *path, uint32_t flags, kiln_error *err)
{
	memset(w, 0, sizeof(*w));
	w->path = path;
	w->dirfd = -1;
	w->fd = -1;
	w->sync = !(flags & KILN_WRITE_NO_SYNC);
	w->live = 1;
	int rc = resolve_target(w, err);
	return rc ? rc : create_temp(w, err);
}

int kiln__pending_create_at(struct kiln__pending *w, int dirfd, const char *name, const char *shown,
			    uint32_t flags, kiln_error *err)
{
	memset(w, 0, sizeof(*w));
	w->path = shown;
	w->fd = -1;
	w->dirfd = -1;
	w->sync = !(flags & KILN_WRITE_NO_SYNC);
	w->private_ = 1;
	w->live = 1;
	w->target = strdup(name);
	w->dir = strdup(shown); /* only compared, to sync each directory once */
	if (!w->target || !w->dir)
		return kiln__nomem(err, 0, NULL);
	w->base = w->target;
	w->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	if (w->dirfd < 0)
		return step_fail(err, w, KILN_IO, errno, "cannot open its directory");
	/* Whatever is at the name, a symlink included, is replaced by the rename, not followed. */
	w->have_old = !fstatat(w->dirfd, name, &w->old, AT_SYMLINK_NOFOLLOW);
	if (w->have_old && S_ISDIR(w->old.st_mode))
		return step_fail(err, w, KILN_IO, EISDIR, "a directory is in its place");
	return create_temp(w, err);
}

int kiln__pending_seal(struct kiln__pending *w, int hide, kiln_error *err)
{
	if (w->sync && kiln__sys.fsync(w->fd) != 0)
		return step_fail(err, w, KILN_IO, errno, "fsync failed");
	/* A named temporary file is closed before it is published, so a late error (NFS reports
	 * write errors at close) still leaves the target alone. An anonymous one needs its
	 * descriptor to be linked: now, to a hidden name, when it must not stay open. */
	if (w->anonymous && hide) {
		char proc[32];
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", w->fd);
		int rc = link_hidden(w, proc, err);
		if (rc)
			return rc;
		w->anonymous = 0;
	}
	if (!w->anonymous) {
		int fd = w->fd;
		w->fd = -1;
		if (close(fd) != 0)
			return step_fail(err, w, KILN_IO, errno, "close failed");
	}
	if (hide)
		dir_done(w);
	return 0;
}

/* Give the sealed file the target's name. Until the rename, the target is untouched. */
static int publish_one(struct kiln__pending *w, kiln_error *err)
{
	if (w->anonymous) {
		char proc[32];
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", w->fd);
		/* Nothing there: the name appears with the complete file behind it. */
		if (!w->have_old &&
		    kiln__sys.linkat(AT_FDCWD, proc, w->dirfd, w->base, AT_SYMLINK_FOLLOW) == 0)
			return 0;
		if (!w->have_old && errno != EEXIST)
			return step_fail(err, w, KILN_IO, errno, "cannot link the new file");
		/* linkat() never replaces a name: link beside the target, then rename over it. */
		int rc = link_hidden(w, proc, err);
		if (rc)
			return rc;
	}
	if (kiln__sys.renameat(w->dirfd, w->tmp, w->dirfd, w->base) != 0)
		return step_fail(err, w, KILN_IO, errno, "cannot rename the new file into place");
	w->tmp[0] = '\0';
	return 0;
}

/* fsync w's directory, so the new names in it survive a crash: 0 or the errno. Reading is the
 * only way to open a directory, so a writable but unreadable one cannot be synced. Some file
 * systems cannot fsync a directory, and need not (EINVAL, EROFS): the files are synced. */
static int sync_dir(struct kiln__pending *w)
{
	int fd = dir_fd(w) < 0
		     ? -1
		     : kiln__sys.openat(w->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	int e = fd < 0 ? errno : 0;
	if (fd >= 0 && kiln__sys.fsync(fd) != 0)
		e = errno;
	if (fd >= 0)
		close(fd);
	return e == EINVAL || e == EROFS ? 0 : e;
}

/* Whether w[k]'s directory is one of w[0, k)'s (synced already). */
static int dir_seen(const struct kiln__pending *w, size_t k)
{
	for (size_t i = 0; i < k; i++)
		if (!strcmp(w[i].dir, w[k].dir))
			return 1;
	return 0;
}

int kiln__publish(struct kiln__pending *w, size_t n, kiln_error *err)
{
	for (size_t k = 0; k < n; k++) {
		int rc = dir_fd(&w[k]) < 0
			     ? step_fail(err, &w[k], KILN_IO, errno, "cannot open its directory")
			     : publish_one(&w[k], err);
		if (rc) {
			if (n > 1 && err) {
				char more[80];
				snprintf(more, sizeof(more), " (%zu of the %zu files are in place)",
					 k, n);
				size_t at = strnlen(err->message, sizeof(err->message) - 1);
				snprintf(err->message + at, sizeof(err->message) - at, "%s", more);
			}
			return rc;
		}
		w[k].published = 1;
		if (n > 1)
			dir_done(&w[k]); /* a set may be thousands of files */
	}
	for (size_t k = 0; k < n; k++) {
		if (!w[k].sync || dir_seen(w, k))
			continue;
		int e = sync_dir(&w[k]);
		if (n > 1)
			dir_done(&w[k]);
		if (e)
			return step_fail(err, &w[k], KILN_UNSYNCED, e,
					 n > 1 ? "all files in place but not durable, a directory "
						 "cannot be synced"
					       : "in place but not durable, its directory cannot "
						 "be synced");
	}
	return 0;
}

void kiln__pending_drop(struct kiln__pending *w)
{
	if (!w->live)
		return;
	if (w->fd >= 0)
		close(w->fd);
	if (w->tmp[0] && !w->published && dir_fd(w) >= 0)
		unlinkat(w->dirfd, w->tmp, 0);
	dir_done(w);
	free(w->target);
	free(w->dir);
	w->live = 0;
}

int kiln_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		      uint32_t flags, kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (!fill)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "fill is NULL");
	if (flags & ~(uint32_t)KILN__WRITE_FLAGS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	struct kiln__pending w;
	int rc = kiln__pending_create(&w, path, flags, err);
	if (!rc && (rc = fill(ctx, w.fd, err)) != 0) {
		/* The fill's own error stands; one that said nothing still gets a line. */
		if (err && err->code == KILN_OK)
			kiln__fail_sys(err, rc > 0 ? rc : KILN_IO, 0,
				       "%s: the fill callback failed (%d)", path, rc);
		if (rc < 0)
			rc = KILN_IO;
	}
	if (!rc)
		rc = kiln__pending_seal(&w, 0, err);
	if (!rc)
		rc = kiln__publish(&w, 1, err);
	kiln__pending_drop(&w);
	return rc;
}
