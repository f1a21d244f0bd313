/* SPDX-License-Identifier: MIT */
/*
 * The resolver: the files of a model from what the caller gave. The one place that asks whether
 * a name is a URL (kiln__is_url, src/net/url.c): a URL is fetched, never opened as a local file;
 * its object's name ends before its query (a presigned URL's signature names no object), so a URL
 * with a query is one file and a URL's series siblings are found by name, never listed. The
 * format a name says, a series from any one of its shards, an index's shards beside it: each
 * decided here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "format/series.h"
#include "io/engine.h"
#include "model/resolve.h"
#include "net/net.h"
#include "source/source.h"

KILN_API int kiln_path_is_url(const char *path)
{
	return kiln__is_url(path);
}

KILN_API size_t kiln_path_shown(const char *path, char *buf, size_t cap)
{
	if (!buf || !cap)
		return 0;
	if (!path)
		snprintf(buf, cap, "(null)");
	else if (kiln__is_url(path))
		kiln__url_shown(path, buf, cap);
	else
		snprintf(buf, cap, "%s", path);
	return strlen(buf);
}

/* Bytes of `path` that name the file or object: a URL's before its query or fragment, all of a
 * local path. */
static size_t name_len(const char *path, int remote)
{
	return remote ? kiln__url_name_len(path) : strlen(path);
}

/* The format the name ends in, or 0. */
static uint32_t named_format(const char *path, size_t n)
{
	static const struct {
		const char *ext;
		uint32_t format;
	} named[] = {{".safetensors", KILN_FORMAT_SAFETENSORS},
		     {".gguf", KILN_FORMAT_GGUF},
		     {".klnt", KILN_FORMAT_KLNT}};
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		size_t e = strlen(named[i].ext);
		if (n > e && !memcmp(path + n - e, named[i].ext, e))
			return named[i].format;
	}
	return 0;
}

/* Entry k of r: `path` taken over; `remote` as the name it came from was found (a series
 * sibling's or an index's shard is where its series or index is, whatever its name says). */
static void set_entry(struct kiln__resolved *r, uint32_t k, char *path, int remote)
{
	struct kiln__entry *e = &r->files[k];
	e->path = path;
	e->remote = remote;
	e->named_format = named_format(path, name_len(path, remote));
}

/* Room for n entries. */
static int entries(struct kiln__resolved *r, uint32_t n, kiln_error *err)
{
	if (!(r->files = calloc(n ? n : 1, sizeof(*r->files))))
		return kiln__nomem(err, 0, NULL);
	r->n = n;
	return 0;
}

/* Copies of the paths as given. */
static int as_given(struct kiln__resolved *r, const char *const *paths, const uint8_t *remote,
		    uint32_t count, kiln_error *err)
{
	int rc = entries(r, count, err);
	for (uint32_t i = 0; !rc && i < count; i++) {
		char *p = strdup(paths[i]);
		if (!p)
			return kiln__nomem(err, 0, NULL);
		set_entry(r, i, p, remote[i]);
	}
	return rc;
}

/* Whether two parsed names are of one series: the same stem, extension and total. */
static int same_series(const char *a, size_t astem, uint32_t atotal, const char *aext,
		       const char *b, size_t bstem, uint32_t btotal, const char *bext)
{
	return astem == bstem && memcmp(a, b, astem) == 0 && atotal == btotal &&
	       strcmp(aext, bext) == 0;
}

/* INVAL when the directory of STEM holds a shard of the same stem and extension with another
 * total (an earlier series left beside this one): which one is meant cannot be told. */
static int check_alone(const char *stem, size_t stem_len, uint32_t total, const char *ext,
		       kiln_error *err)
{
	const char *slash = memrchr(stem, '/', stem_len);
	size_t dlen = slash ? (size_t)(slash - stem) + 1 : 0;
	char *dname = dlen ? strndup(stem, dlen) : strdup(".");
	if (!dname)
		return kiln__nomem(err, 0, NULL);
	DIR *d = opendir(dname);
	free(dname);
	if (!d)
		return 0; /* every shard opened: a directory we cannot list hides nothing we use */
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d))) {
		char *full = NULL;
		if (asprintf(&full, "%.*s%s", (int)dlen, stem, e->d_name) < 0) {
			rc = kiln__nomem(err, 0, NULL);
			break;
		}
		uint32_t no, tot;
		const char *x;
		size_t sl = kiln_series_parse(full, &no, &tot, &x);
		if (sl == stem_len && memcmp(full, stem, sl) == 0 && strcmp(x, ext) == 0 &&
		    tot != total)
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
					      "%s: another series of the same name (%" PRIu32
					      " shards) beside the %" PRIu32 "-shard one",
					      full, tot, total);
		free(full);
	}
	closedir(d);
	return rc;
}

/* A list of shards: every one of the series of paths[0] (stem_len, total, ext), each once. */
static int check_list(const char *const *paths, uint32_t count, size_t stem_len, uint32_t total,
		      const char *ext, kiln_error *err)
{
	uint32_t series = 0;
	for (uint32_t i = 0; i < count; i++)
		series += kiln_series_parse(paths[i], NULL, NULL, NULL) != 0;
	if (series != count)
		return kiln__fail_inval(err, KILN_NO_INDEX, "path",
					"the files are not one series: some names are "
					"STEM-NNNNN-of-MMMMM.EXT and some are not");
	if (count != total)
		return kiln__fail_inval(err, KILN_NO_INDEX, "path",
					"%s is one of %" PRIu32 " shards but %" PRIu32
					" files were given",
					paths[0], total, count);
	uint8_t *seen = calloc((size_t)total + 1, 1);
	if (!seen)
		return kiln__nomem(err, 0, NULL);
	int rc = 0;
	for (uint32_t i = 0; i < count && !rc; i++) {
		uint32_t a, b;
		const char *x;
		size_t sl = kiln_series_parse(paths[i], &a, &b, &x);
		if (!same_series(paths[i], sl, b, x, paths[0], stem_len, total, ext))
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
					      "%s is not a shard of the series of %s", paths[i],
					      paths[0]);
		else if (seen[a]++)
			rc =
			    kiln__fail_inval(err, KILN_NO_INDEX, "path",
					     "shard %" PRIu32 " of %s is given twice", a, paths[0]);
	}
	free(seen);
	return rc;
}

/* Paths that are not an index: one file, a whole series from one of its shards, or a list. */
static int resolve_paths(const char *const *paths, const uint8_t *remote, uint32_t count,
			 int one_file, struct kiln__resolved *r, kiln_error *err)
{
	uint32_t no, total;
	const char *ext;
	size_t stem_len = kiln_series_parse(paths[0], &no, &total, &ext);
	/* A URL with a query (a presigned one) names one object: its siblings' queries differ. */
	if ((one_file && count == 1) || paths[0][name_len(paths[0], remote[0])])
		stem_len = 0;
	if (!stem_len && count == 1)
		return as_given(r, paths, remote, 1, err);
	if (count > 1) {
		/* A list: either every name is a shard of one series, or none is. */
		uint32_t series = 0;
		for (uint32_t i = 0; i < count; i++)
			series += kiln_series_parse(paths[i], NULL, NULL, NULL) != 0;
		if (series == 0)
			return as_given(r, paths, remote, count, err);
		int rc = check_list(paths, count, stem_len, total, ext, err);
		if (rc)
			return rc;
	}
	/* The whole series, in order, named from the stem; every shard must be there. */
	int rc = entries(r, total, err);
	for (uint32_t i = 0; !rc && i < total; i++) {
		char *p = kiln__series_path(paths[0], stem_len, i + 1, total, ext);
		if (!p)
			return kiln__nomem(err, 0, NULL);
		set_entry(r, i, p, remote[0]);
	}
	if (!rc && !remote[0]) /* a URL's siblings cannot be listed */
		rc = check_alone(paths[0], stem_len, total, ext, err);
	return rc;
}

/* A whole small file (an index) into new memory, at most `cap` bytes. */
static int read_small(const char *path, int remote, const kiln_open_options *o, size_t cap,
		      char **out, size_t *len, kiln_error *err)
{
	if (remote)
		return kiln__remote_read_small(path, o ? o->remote : NULL, cap, out, len, err);
	uint64_t size;
	int fd = kiln__open_file(path, &size, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	int rc = 0;
	char *buf = NULL;
	if (size > cap)
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "length", KILN_NO_OFFSET,
				"%s: %" PRIu64 " bytes, above the %zu-byte cap of an index", path,
				size, cap);
	else if (!(buf = malloc((size_t)size + 1)))
		rc = kiln__nomem(err, 0, NULL);
	else if ((rc = kiln__pread_full(fd, buf, (size_t)size, 0, err)))
		kiln__error_prefix(err, path);
	close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[size] = '\0';
	*out = buf;
	*len = (size_t)size;
	return 0;
}

/* What an index may name (one policy, for local and remote indexes alike): a relative name of
 * non-empty segments below the index's own directory. Refused: a scheme or a host ("http://..."
 * would send the fetch wherever the index says, and a local index must name only local files),
 * an absolute path, "." and ".." segments. A URL's name is percent-decoded first, as its server
 * will decode it ("%2e%2e/" is ".."), and may not hold what would end or change its path. */
static const char *shard_check(const char *p, size_t n, void *ctx)
{
	int remote = *(const int *)ctx;
	if (p[0] == '/')
		return "it is an absolute path";
	size_t first = strcspn(p, "/");
	if (memchr(p, ':', first < n ? first : n))
		return "it names a scheme or a host";
	char buf[4096];
	if (remote) {
		if (n >= sizeof(buf))
			return "it is too long";
		if (strpbrk(p, "\\?#"))
			return "it holds a backslash, '?' or '#'";
		size_t k = 0;
		for (size_t i = 0; i < n; i++) {
			int hi, lo;
			if (p[i] != '%') {
				buf[k++] = p[i];
				continue;
			}
			if (i + 2 >= n || (hi = kiln__hex_digit(p[i + 1])) < 0 ||
			    (lo = kiln__hex_digit(p[i + 2])) < 0)
				return "it holds a '%' that is no escape";
			buf[k++] = (char)(hi << 4 | lo);
			i += 2;
		}
		if (memchr(buf, 0, k) || memchr(buf, '\\', k))
			return "it holds an escaped U+0000 or backslash";
		p = buf;
		n = k;
	}
	for (size_t i = 0; i <= n;) {
		const char *e = memchr(p + i, '/', n - i);
		size_t len = e ? (size_t)(e - (p + i)) : n - i;
		if (len == 0)
			return "it has an empty segment";
		if (len <= 2 && !memcmp(p + i, "..", len))
			return remote ? "it has a \".\" or \"..\" segment (once decoded)"
				      : "it has a \".\" or \"..\" segment";
		i += len + 1;
	}
	return NULL;
}

/* Bytes of an index's name that name its directory, shards to be put after them: a local
 * path's up to its last '/' (none: the current directory); a URL's up to the last '/' of its
 * path, never into its scheme or host (a URL with no path: its authority, and *slash says a
 * '/' must follow). */
static size_t index_dir(const char *path, int remote, int *slash)
{
	*slash = 0;
	size_t n = name_len(path, remote), from = 0;
	if (remote) {
		const char *a = strstr(path, "://");
		from = a ? (size_t)(a - path) + 3 : 0;
		from += strcspn(path + from, "/?#");
		if (from >= n) {
			*slash = 1;
			return n;
		}
	}
	const char *last = n > from ? memrchr(path + from, '/', n - from) : NULL;
	return last ? (size_t)(last - path) + 1 : from;
}

/* A model.safetensors.index.json: the shards its weight_map names, beside it, as one model of
 * safetensors files, local for a local index and remote for a remote one. */
static int resolve_index(const char *path, int remote, const kiln_open_options *o,
			 struct kiln__resolved *r, kiln_error *err)
{
	char *text = NULL;
	size_t len = 0;
	int rc = read_small(path, remote, o, KILN__ST_HEADER_MAX, &text, &len, err);
	if (rc) {
		r->index_shown = path;
		if (remote) {
			kiln__url_shown(path, r->url_shown, sizeof(r->url_shown));
			r->index_shown = r->url_shown;
		}
		return rc;
	}
	return kiln__resolve_index_text(path, remote, text, len, r, err);
}

int kiln__resolve_index_text(const char *path, int remote, char *text, size_t len,
			     struct kiln__resolved *r, kiln_error *err)
{
	r->index_shown = path;
	if (remote) {
		kiln__url_shown(path, r->url_shown, sizeof(r->url_shown));
		r->index_shown = r->url_shown;
	}
	int rc = kiln__st_index_parse(text, len, r->index_shown, shard_check, &remote, &r->ix, err);
	if (rc)
		return rc;
	r->index = path;
	r->format = KILN_FORMAT_SAFETENSORS;
	int slash;
	size_t dlen = index_dir(path, remote, &slash);
	if ((rc = entries(r, r->ix.nshards, err)))
		return rc;
	for (uint32_t i = 0; i < r->ix.nshards; i++) {
		size_t n = strlen(r->ix.shards[i]);
		char *p = malloc(dlen + (size_t)slash + n + 1);
		if (!p)
			return kiln__nomem(err, 0, NULL);
		memcpy(p, path, dlen);
		if (slash)
			p[dlen] = '/';
		memcpy(p + dlen + (size_t)slash, r->ix.shards[i], n + 1);
		set_entry(r, i, p, remote);
	}
	return 0;
}

int kiln__resolve(const char *const *paths, uint32_t count, const kiln_open_options *o,
		  struct kiln__resolved *r, kiln_error *err)
{
	memset(r, 0, sizeof(*r));
	/* The one question, asked once of each name given (on the stack for the usual few: an
	 * allocation here was a tenth of a small file's warm open). */
	uint8_t few[16], *remote = count <= sizeof(few) ? few : malloc(count);
	if (!remote)
		return kiln__nomem(err, 0, NULL);
	for (uint32_t i = 0; i < count; i++)
		remote[i] = (uint8_t)kiln__is_url(paths[i]);
	unsigned want = o ? o->format : KILN_FORMAT_AUTO;
	int rc = -1;
	for (uint32_t i = 0; rc < 0 && i < count; i++) {
		size_t n = name_len(paths[i], remote[i]);
		if (n >= 5 && !memcmp(paths[i] + n - 5, ".json", 5) &&
		    (want == KILN_FORMAT_AUTO || want == KILN_FORMAT_SAFETENSORS))
			rc = count != 1
				 ? kiln__fail_inval(err, KILN_NO_INDEX, "path",
						    "%s: an index is the only path of its model",
						    paths[i])
				 : resolve_index(paths[0], remote[0], o, r, err);
	}
	if (rc < 0)
		rc = resolve_paths(paths, remote, count, o && (o->flags & KILN_OPEN_ONE_FILE), r,
				   err);
	if (remote != few)
		free(remote);
	return rc;
}

void kiln__resolve_explain(const struct kiln__resolved *r, int rc, kiln_error *err)
{
	if (r->index && rc == KILN_IO && err && err->file < r->n && err->sys_errno == ENOENT)
		snprintf(err->message, sizeof(err->message),
			 "%s: shard %s, which its weight_map names, is missing", r->index_shown,
			 r->ix.shards[err->file]);
}

int kiln__resolve_check(const struct kiln__resolved *r, const struct kiln_model *m, kiln_error *err)
{
	return r->index ? kiln__st_index_check(m, &r->ix, r->index_shown, err) : 0;
}

void kiln__resolved_free(struct kiln__resolved *r)
{
	for (uint32_t i = 0; r->files && i < r->n; i++)
		free(r->files[i].path);
	free(r->files);
	kiln__st_index_free(&r->ix);
	memset(r, 0, sizeof(*r));
}
