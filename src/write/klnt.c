/* SPDX-License-Identifier: MIT */
/*
 * The canonical writer (spec section 7): header, descriptors, heap (names then layout names),
 * zero pad, then payloads at the next multiple of 64 in descriptor order. The encoded header and
 * directory go through the reader's own structural pass before a byte is written, so the writer
 * refuses exactly what the reader would reject, with the same class.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/internal.h"
#include "base/sys.h"

#define CHUNK (1u << 20)

struct plan {
	uint32_t n;
	uint8_t *head; /* payload_base bytes: header, descriptors, heap, pad */
	uint64_t payload_base;
	uint64_t block;
	uint64_t *offsets; /* byte_offset per tensor */
	uint64_t *lengths; /* byte_length per tensor */
};

static void plan_free(struct plan *p)
{
	free(p->head);
	free(p->offsets);
	p->head = NULL;
	p->offsets = NULL;
	p->lengths = NULL;
}

/* Errors found before encoding have no block offset yet. */
#define WFAIL(code, i, field, fmt, ...) \
	kiln__fail(err, code, i, field, KILN_NO_OFFSET, "tensor %" PRIu32 ": " fmt, i, __VA_ARGS__)

/* Byte lengths and heap slices: what the descriptors will say. Only rules the encoding itself
 * cannot express are checked here (sizes that do not fit their fields); everything else is left
 * to the reader's pass over the encoded bytes. */
static int plan_sizes(const kiln_tensor_spec *ts, uint32_t n, struct plan *p, uint64_t *heap_len,
		      kiln_error *err)
{
	uint64_t cursor = 0, heap = 0;
	for (int pass = 0; pass < 2; pass++) {
		/* pass 0: tensor names; pass 1: layout names (heap order) */
		for (uint32_t i = 0; i < n; i++) {
			const kiln_tensor_spec *t = &ts[i];
			const char *s = pass ? t->layout : t->name;
			size_t len = pass ? t->layout_len : t->name_len;
			if (!s)
				continue;
			if (len > 0xFFFF)
				return WFAIL(KILN_LIMIT, i, pass ? "layout_len" : "name_len",
					     "a %zu-byte name does not fit a u16 length", len);
			if (len && heap >= 0xFFFF)
				return WFAIL(KILN_LIMIT, i, pass ? "layout_off" : "name_off",
					     "the name would start at heap offset %" PRIu64
					     ", past the last encodable offset 65534",
					     heap);
			heap += len;
		}
	}
	if (heap > UINT32_MAX)
		return kiln__fail_at(err, KILN_LIMIT, "name_bytes", KILN_NO_OFFSET,
				     "the heap would be %" PRIu64 " bytes, more than a u32", heap);
	*heap_len = heap;

	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *t = &ts[i];
		uint64_t len = t->byte_length;
		unsigned bits = kiln_dtype_bits(t->dtype);
		if (bits && t->rank <= KILN_MAX_RANK) {
			uint64_t count, want;
			if (kiln__element_count(t->shape, t->rank, &count))
				return WFAIL(KILN_LIMIT, i, "shape",
					     "the element count overflows %d bits", 64);
			if (kiln__payload_bytes(count, bits, &want))
				return WFAIL(KILN_LIMIT, i, "shape",
					     "%" PRIu64 " elements of %u bits overflow 64 bits",
					     count, bits);
			if (len && len != want)
				return WFAIL(KILN_TYPE, i, "byte_length",
					     "byte_length %" PRIu64
					     " given but the shape needs %" PRIu64,
					     len, want);
			len = want;
		}
		uint64_t off = kiln__align64(cursor);
		if (off < cursor || kiln__add_overflows(off, len, &cursor))
			return WFAIL(KILN_LIMIT, i, "byte_length",
				     "the payload region would pass 2^64 bytes (offset %" PRIu64
				     ", length %" PRIu64 ")",
				     off, len);
		p->offsets[i] = off;
		p->lengths[i] = len;
	}
	uint64_t dir_bytes = (uint64_t)n * KILN__DESC_SIZE + heap;
	p->payload_base = kiln__align64(KILN__HEADER_SIZE + dir_bytes);
	if (kiln__add_overflows(p->payload_base, cursor, &p->block))
		return kiln__fail_at(err, KILN_LIMIT, "payload_bytes", KILN_NO_OFFSET,
				     "the block would pass 2^64 bytes");
	return 0;
}

static void put_slice(uint8_t *d, int off_field, int len_field, const char *s, size_t len,
		      uint64_t *cursor)
{
	if (!s) {
		kiln__st16(d + off_field, KILN_NONE16);
		kiln__st16(d + len_field, 0);
		return;
	}
	/* An empty name is written as offset/length (cursor, 0), which the reader rejects. */
	kiln__st16(d + off_field, (uint16_t)*cursor);
	kiln__st16(d + len_field, (uint16_t)len);
	*cursor += len;
}

static int plan_build(const kiln_tensor_spec *ts, uint32_t n, struct plan *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	p->n = n;
	if (n && !ts)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"tensors is NULL with a count of %" PRIu32, n);
	if (n) {
		p->offsets = calloc(2 * (size_t)n, sizeof(uint64_t));
		if (!p->offsets)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
		p->lengths = p->offsets + n;
	}
	uint64_t heap = 0;
	int rc = plan_sizes(ts, n, p, &heap, err);
	if (rc)
		return rc;
	p->head = calloc(1, (size_t)p->payload_base);
	if (!p->head)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");

	int named = n && ts[0].name;
	uint8_t *h = p->head;
	memcpy(h, "KLNT", 4);
	h[4] = 2;
	h[5] = (uint8_t)(KILN_FLAG_LITTLE_ENDIAN | (named ? KILN_FLAG_NAMES : 0));
	kiln__st32(h + 8, n);
	kiln__st32(h + 12, (uint32_t)heap);
	kiln__st64(h + 16, n ? p->offsets[n - 1] + p->lengths[n - 1] : 0);
	kiln__st64(h + 24, (uint64_t)n * KILN__DESC_SIZE + heap);

	uint64_t heap_at = KILN__HEADER_SIZE + (uint64_t)n * KILN__DESC_SIZE;
	uint64_t cursor = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < n; i++) {
			const kiln_tensor_spec *t = &ts[i];
			uint8_t *d = h + KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
			const char *s = pass ? t->layout : t->name;
			size_t len = pass ? t->layout_len : t->name_len;
			if (s)
				memcpy(h + heap_at + cursor, s, len);
			if (pass)
				put_slice(d, KILN__D_LAYOUT_OFF, KILN__D_LAYOUT_LEN, s, len,
					  &cursor);
			else
				put_slice(d, KILN__D_NAME_OFF, KILN__D_NAME_LEN, s, len, &cursor);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		/* The reader would say the NAMES flag disagrees with the name; the caller never set
		 * a flag, so say it in their terms (same class and field). */
		if ((ts[i].name != NULL) != named)
			return kiln__fail(err, KILN_TYPE, i, "name_off", KILN_NO_OFFSET,
					  "tensor %" PRIu32 " is %s but tensor 0 is %s: name every "
					  "tensor or none",
					  i, named ? "unnamed" : "named",
					  named ? "named" : "unnamed");
	}
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *t = &ts[i];
		uint8_t *d = h + KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
		kiln__st16(d + KILN__D_DTYPE, t->dtype);
		d[KILN__D_RANK] = t->rank;
		kiln__st32(d + KILN__D_BLOCK_SIZE, t->block_size);
		int q = t->quant_scheme != 0;
		kiln__st16(d + KILN__D_QUANT_SCHEME, t->quant_scheme);
		kiln__st16(d + KILN__D_QUANT_AXIS, q ? t->quant_axis : KILN_NONE16);
		kiln__st32(d + KILN__D_GROUP_SIZE, q ? t->group_size : 0);
		kiln__st32(d + KILN__D_SCALE_INDEX, q ? t->scale_index : KILN_NONE32);
		kiln__st32(d + KILN__D_OUTER_INDEX, t->quant_scheme == KILN_QUANT_BLOCK
							? KILN_NONE32
						    : q ? t->outer_index
							: KILN_NONE32);
		kiln__st64(d + KILN__D_BYTE_OFFSET, p->offsets[i]);
		kiln__st64(d + KILN__D_BYTE_LENGTH, p->lengths[i]);
		for (unsigned k = 0; k < KILN_MAX_RANK; k++)
			kiln__st64(d + KILN__D_SHAPE + 8 * k, t->shape[k]);
	}

	/* The reader's structural pass over the encoded directory decides the rest. */
	return kiln__check_directory(p->head, p->block, err);
}

/* The 4-bit rule of payload verification, checked on the bytes the caller supplied. */
static int check_nibble(const kiln_tensor_spec *t, uint32_t i, uint8_t last, kiln_error *err)
{
	uint64_t count;
	if (kiln_dtype_bits(t->dtype) != 4 || kiln__element_count(t->shape, t->rank, &count) ||
	    !(count & 1) || !(last & 0xF0))
		return 0;
	return kiln__fail(err, KILN_TYPE, i, "payload padding", KILN_NO_OFFSET,
			  "tensor %" PRIu32 ": %" PRIu64 " 4-bit elements but the unused high "
			  "nibble of the last byte is 0x%x, not 0",
			  i, count, last >> 4);
}

int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err)
{
	if (t->data) {
		memcpy(dst, (const uint8_t *)t->data + off, len);
		return 0;
	}
	if (!t->read) {
		if (len == 0)
			return 0;
		return kiln__fail_inval(err, i, "data",
					"tensor %" PRIu32
					": %zu payload bytes but neither data nor read "
					"is set",
					i, len);
	}
	int e = t->read(t->read_ctx, i, off, dst, len);
	if (e == ECANCELED)
		return kiln__fail(err, KILN_CANCELED, i, NULL, KILN_NO_OFFSET,
				  "tensor %" PRIu32 ": the payload callback stopped the write at "
				  "offset %" PRIu64,
				  i, off);
	if (e)
		return kiln__fail_sys(err, KILN_IO, e,
				      "tensor %" PRIu32
				      ": the payload callback failed at offset %" PRIu64 ": %s",
				      i, off, strerror(e));
	return 0;
}

int kiln_write_size(const kiln_tensor_spec *tensors, uint32_t count, uint64_t *block_length,
		    kiln_error *err)
{
	kiln__clear_error(err);
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (!rc && block_length)
		*block_length = p.block;
	plan_free(&p);
	return rc;
}

int kiln_write_memory(const kiln_tensor_spec *tensors, uint32_t count, void *buf, size_t cap,
		      size_t *written, kiln_error *err)
{
	kiln__clear_error(err);
	if (written)
		*written = 0;
	if (!buf && cap)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "buf is NULL");
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (rc)
		goto out;
	if (p.block > cap) {
		rc = kiln__fail_at(err, KILN_LIMIT, "length", KILN_NO_OFFSET,
				   "the block is %" PRIu64 " bytes but the buffer holds %zu",
				   p.block, cap);
		goto out;
	}
	uint8_t *b = buf;
	memcpy(b, p.head, (size_t)p.payload_base);
	uint64_t cursor = 0;
	for (uint32_t i = 0; i < count; i++) {
		uint8_t *dst = b + p.payload_base + p.offsets[i];
		memset(b + p.payload_base + cursor, 0, (size_t)(p.offsets[i] - cursor));
		size_t len = (size_t)p.lengths[i];
		for (size_t done = 0; done < len;) {
			size_t step = len - done < CHUNK ? len - done : CHUNK;
			rc = kiln__produce(&tensors[i], i, done, dst + done, step, err);
			if (rc)
				goto out;
			done += step;
		}
		if (len && (rc = check_nibble(&tensors[i], i, dst[len - 1], err)))
			goto out;
		cursor = p.offsets[i] + len;
	}
	if (written)
		*written = (size_t)p.block;
out:
	plan_free(&p);
	return rc;
}

/*
 * kiln_write_atomic (under kiln_write_file, and the converters' writers). The new file is built
 * where the target lives, so that rename() can swap it in atomically, and it stays invisible until
 * it is complete:
 *
 * 1. resolve: follow a symlink at `path` to the file it names (the link stays a link), note the
 *    mode and owner of the file being replaced;
 * 2. create: an O_TMPFILE in that directory, which has no name at all (a crash or kill leaves
 *    nothing behind); where the file system refuses O_TMPFILE, a file with a random name;
 * 3. let the caller's fill write it, then fsync;
 * 4. publish: link the anonymous file to the target name when nothing is there, else to a random
 *    name that rename() then moves over the target;
 * 5. fsync the directory, so the new name survives a crash.
 *
 * Any failure up to the rename leaves `path` untouched and removes the temporary file. A failure
 * in step 5 is UNSYNCED: the new file is in place, but a crash may still bring back the old one.
 */

#define SYMLINK_HOPS 40 /* the kernel's own limit (MAXSYMLINKS) */

struct wfile {
	const char *path; /* as the caller gave it, for messages */
	char *target;     /* the file to replace: path with its symlinks followed (malloc'd) */
	const char *base; /* last component of target */
	int dirfd;        /* O_PATH descriptor of target's directory */
	int have_old;     /* something is at target now; old is its stat */
	struct stat old;  /* mode and owner to keep */
	int fd;           /* the new file */
	int anonymous;    /* fd is an O_TMPFILE, with no name until linked */
	char tmp[32];     /* the name the new file has in dirfd before the rename, or "" */
};

/* "PATH: STEP: strerror" with errno kept: the step says what had or had not happened. */
static int step_fail(kiln_error *err, const struct wfile *w, int code, int e, const char *step)
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

/* Follow symlinks at the last component of w->path, as open() would, so the new file replaces
 * what the link points to. A dangling link names the file to create. */
static int resolve_target(struct wfile *w, kiln_error *err)
{
	char *cur = strdup(w->path);
	if (!cur)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
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
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
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
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
	/* O_PATH: no read permission needed, so a writable but unreadable directory still works. */
	w->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int e = errno;
	free(dir);
	if (w->dirfd < 0)
		return step_fail(err, w, KILN_IO, e, "cannot open its directory");
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
static int keep_mode_and_owner(struct wfile *w, kiln_error *err)
{
	if (fchown(w->fd, w->old.st_uid, w->old.st_gid) != 0 && errno == EPERM)
		(void)fchown(w->fd, (uid_t)-1, w->old.st_gid);
	if (fchmod(w->fd, w->old.st_mode & 07777) != 0)
		return step_fail(err, w, KILN_IO, errno, "cannot set the mode of the new file");
	return 0;
}

static int create_temp(struct wfile *w, kiln_error *err)
{
	/* New files get 0666 & ~umask like any other; a replacement starts out no more open than
	 * its predecessor, before a byte is written. */
	mode_t mode = w->have_old ? (w->old.st_mode & 0777) : 0666;
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

/* Give the finished file the target's name. Until the rename, `path` is untouched. */
static int publish(struct wfile *w, kiln_error *err)
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
		int e = EEXIST;
		for (int attempt = 0; attempt < 16 && e == EEXIST; attempt++) {
			kiln__random_name(w->tmp, sizeof(w->tmp));
			e = kiln__sys.linkat(AT_FDCWD, proc, w->dirfd, w->tmp, AT_SYMLINK_FOLLOW)
				? errno
				: 0;
		}
		if (e) {
			w->tmp[0] = '\0';
			return step_fail(err, w, KILN_IO, e, "cannot link the new file");
		}
	}
	if (kiln__sys.renameat(w->dirfd, w->tmp, w->dirfd, w->base) != 0)
		return step_fail(err, w, KILN_IO, errno, "cannot rename the new file into place");
	w->tmp[0] = '\0';
	return 0;
}

/* fsync the directory, so the new name survives a crash. Reading is the only way to open a
 * directory, so a writable but unreadable one cannot be synced. */
static int sync_dir(struct wfile *w, kiln_error *err)
{
	int fd = kiln__sys.openat(w->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	int e = fd < 0 ? errno : 0;
	if (fd >= 0 && kiln__sys.fsync(fd) != 0)
		e = errno;
	if (fd >= 0)
		close(fd);
	/* Some file systems cannot fsync a directory, and need not: the file is synced. */
	if (!e || e == EINVAL || e == EROFS)
		return 0;
	return step_fail(err, w, KILN_UNSYNCED, e,
			 "in place but not durable, its directory cannot be synced");
}

/* kiln_write_file's fill: the block, head, then each payload after its zero pad, streamed in
 * chunks. */
struct block_fill {
	const char *path;
	const struct plan *p;
	const kiln_tensor_spec *tensors;
	uint8_t *chunk;
};

static int write_block(void *ctx, int fd, kiln_error *err)
{
	static const uint8_t zeros[64];
	const struct block_fill *b = ctx;
	const struct plan *p = b->p;
	const kiln_tensor_spec *tensors = b->tensors;
	int e = kiln__write_all(fd, p->head, (size_t)p->payload_base);
	uint64_t cursor = 0;
	for (uint32_t i = 0; i < p->n && !e; i++) {
		e = kiln__write_all(fd, zeros, (size_t)(p->offsets[i] - cursor));
		uint64_t len = p->lengths[i];
		uint8_t last = 0;
		for (uint64_t done = 0; done < len && !e; done += CHUNK) {
			size_t step = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
			const uint8_t *src = b->chunk;
			if (tensors[i].data)
				src = (const uint8_t *)tensors[i].data + done;
			else {
				int rc = kiln__produce(&tensors[i], i, done, b->chunk, step, err);
				if (rc)
					return rc;
			}
			e = kiln__write_all(fd, src, step);
			last = src[step - 1];
		}
		if (!e && len) {
			int rc = check_nibble(&tensors[i], i, last, err);
			if (rc)
				return rc;
		}
		cursor = p->offsets[i] + len;
	}
	return e ? kiln__fail_sys(err, KILN_IO, e, "%s: write failed: %s", b->path, strerror(e))
		 : 0;
}

int kiln_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		      uint32_t flags, kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (!fill)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "fill is NULL");
	if (flags & ~(uint32_t)KILN_WRITE_NO_SYNC)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	int sync = !(flags & KILN_WRITE_NO_SYNC);
	struct wfile w = {.path = path, .dirfd = -1, .fd = -1};
	int rc;
	if ((rc = resolve_target(&w, err)) || (rc = create_temp(&w, err)))
		goto out;
	if ((rc = fill(ctx, w.fd, err)) != 0) {
		/* The fill's own error stands; one that said nothing still gets a line. */
		if (err && err->code == KILN_OK)
			kiln__fail_sys(err, rc > 0 ? rc : KILN_IO, 0,
				       "%s: the fill callback failed (%d)", path, rc);
		if (rc < 0)
			rc = KILN_IO;
		goto out;
	}
	if (sync && kiln__sys.fsync(w.fd) != 0) {
		rc = step_fail(err, &w, KILN_IO, errno, "fsync failed");
		goto out;
	}
	/* A named temporary file is closed before the rename, so a late error (NFS reports write
	 * errors at close) still leaves the target alone. An anonymous one needs its descriptor to
	 * be linked; it was synced, or the caller chose not to care. */
	if (!w.anonymous) {
		int fd = w.fd;
		w.fd = -1;
		if (close(fd) != 0) {
			rc = step_fail(err, &w, KILN_IO, errno, "close failed");
			goto out;
		}
	}
	if ((rc = publish(&w, err)))
		goto out;
	if (sync)
		rc = sync_dir(&w, err);
out:
	if (w.fd >= 0)
		close(w.fd);
	if (w.tmp[0])
		unlinkat(w.dirfd, w.tmp, 0);
	if (w.dirfd >= 0)
		close(w.dirfd);
	free(w.target);
	return rc;
}

int kiln_write_file(const char *path, const kiln_tensor_spec *tensors, uint32_t count,
		    uint32_t flags, kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (flags & ~(uint32_t)KILN_WRITE_NO_SYNC)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	uint8_t *chunk = NULL;
	if (!rc && !(chunk = malloc(CHUNK)))
		rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
	if (!rc) {
		struct block_fill b = {.path = path, .p = &p, .tensors = tensors, .chunk = chunk};
		rc = kiln_write_atomic(path, write_block, &b, flags, err);
	}
	free(chunk);
	plan_free(&p);
	return rc;
}
