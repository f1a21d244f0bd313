/* SPDX-License-Identifier: MIT */
/*
 * Sets: several KLNT files opened as one model. Each shard is an ordinary directory opened with
 * kiln_dir_open (so every rule and option applies to it alone, and scale references stay inside
 * it); the set adds one namespace over them: a global index and a name table keyed like a
 * directory's, built in one pass over the shards' views, so opening N shards costs about N opens.
 *
 * A series is STEM-NNNNN-of-MMMMM.klnt, NNNNN from 00001 to MMMMM: any one shard finds the others
 * by name in its directory, and a list of series names must be exactly one whole series.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "io.h"

struct set_slot {
	uint64_t hash;
	uint64_t ref; /* (shard << 32 | index) + 1; 0 empty */
};

struct kiln_set {
	uint32_t n;      /* shards */
	kiln_dir **dirs; /* by shard */
	char **paths;    /* by shard */
	uint64_t *first; /* global index of each shard's first tensor; first[n] = count */
	uint64_t count;
	/* Name table over every shard: (shard, index) pairs, open addressing, keyed hash. */
	struct set_slot *slots; /* kiln__owned_zalloc'd, slots_bytes long */
	size_t slots_bytes;
	uint64_t slot_mask;
	uint8_t secret[KILN__SECRET_SIZE];
};

#define SERIES_SUFFIX ".klnt"

/* Parse ".../STEM-NNNNN-of-MMMMM.klnt": the length of the prefix up to and including STEM, the
 * shard number and the total. 0 when `path` is not a series name. */
static uint32_t digits5(const char *s)
{
	uint32_t v = 0;
	for (int k = 0; k < 5; k++) {
		if (s[k] < '0' || s[k] > '9')
			return 0;
		v = v * 10 + (uint32_t)(s[k] - '0');
	}
	return v;
}

static size_t series_parts(const char *path, uint32_t *no, uint32_t *total)
{
	static const char tail[] = "-NNNNN-of-MMMMM" SERIES_SUFFIX;
	size_t len = strlen(path), tl = sizeof(tail) - 1;
	if (len <= tl)
		return 0;
	const char *s = path + len - tl;
	if (s[0] != '-' || memcmp(s + 6, "-of-", 4) != 0 || strcmp(s + 15, SERIES_SUFFIX) != 0)
		return 0;
	uint32_t a = digits5(s + 1), b = digits5(s + 10);
	if (a == 0 || b == 0 || a > b)
		return 0;
	*no = a;
	*total = b;
	return len - tl;
}

static char *series_name(const char *stem, size_t stem_len, uint32_t no, uint32_t total)
{
	char *p = NULL;
	if (asprintf(&p, "%.*s-%05" PRIu32 "-of-%05" PRIu32 SERIES_SUFFIX, (int)stem_len, stem, no,
		     total) < 0)
		return NULL;
	return p;
}

static int nomem(kiln_error *err)
{
	return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
}

/* A file in the series' directory that looks like a shard of the same stem but is not one of
 * 1..total (another total, or a number past it): the series is ambiguous. */
static int check_no_extra(const char *stem, size_t stem_len, uint32_t total, kiln_error *err)
{
	const char *slash = memrchr(stem, '/', stem_len);
	size_t dlen = slash ? (size_t)(slash - stem) + 1 : 0;
	char *dname = dlen ? strndup(stem, dlen) : strdup(".");
	if (!dname)
		return nomem(err);
	DIR *d = opendir(dname);
	free(dname);
	if (!d)
		return 0; /* every shard opened: a directory we cannot list hides nothing we use */
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d))) {
		char *full = NULL;
		if (asprintf(&full, "%.*s%s", (int)dlen, stem, e->d_name) < 0) {
			rc = nomem(err);
			break;
		}
		uint32_t no, tot;
		size_t sl = series_parts(full, &no, &tot);
		if (sl == stem_len && memcmp(full, stem, sl) == 0 && tot != total)
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
					      "%s: another series of the same name (%" PRIu32
					      " shards) beside the %" PRIu32 "-shard one",
					      full, tot, total);
		free(full);
	}
	closedir(d);
	return rc;
}

/* The shard paths of the set, in order: a series from any one of its shards, a list checked to
 * be one whole series when its names say series, or the list as given. */
static int resolve_paths(const char *const *paths, uint32_t count, char ***out, uint32_t *n,
			 kiln_error *err)
{
	uint32_t no, total;
	size_t stem_len = series_parts(paths[0], &no, &total);
	if (count == 1 && !stem_len) {
		char **p = calloc(1, sizeof(*p));
		if (!p || !(p[0] = strdup(paths[0]))) {
			free(p);
			return nomem(err);
		}
		*out = p;
		*n = 1;
		return 0;
	}
	if (count > 1) {
		/* A list: either every name is a shard of one series, or none is. */
		int series = 0;
		for (uint32_t i = 0; i < count; i++) {
			uint32_t a, b;
			series += series_parts(paths[i], &a, &b) != 0;
		}
		if (series == 0) {
			char **p = calloc(count, sizeof(*p));
			if (!p)
				return nomem(err);
			for (uint32_t i = 0; i < count; i++)
				if (!(p[i] = strdup(paths[i]))) {
					while (i--)
						free(p[i]);
					free(p);
					return nomem(err);
				}
			*out = p;
			*n = count;
			return 0;
		}
		if (series != (int)count)
			return kiln__fail_inval(err, KILN_NO_INDEX, "path",
						"the files are not one series: some names are "
						"STEM-NNNNN-of-MMMMM.klnt and some are not");
		if (count != total)
			return kiln__fail_inval(err, KILN_NO_INDEX, "path",
						"%s is one of %" PRIu32 " shards but %" PRIu32
						" files were given",
						paths[0], total, count);
		uint8_t *seen = calloc(total + 1, 1);
		if (!seen)
			return nomem(err);
		for (uint32_t i = 0; i < count; i++) {
			uint32_t a, b;
			size_t sl = series_parts(paths[i], &a, &b);
			int rc = 0;
			if (sl != stem_len || memcmp(paths[i], paths[0], sl) != 0 || b != total)
				rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
						      "%s is not a shard of the series of %s",
						      paths[i], paths[0]);
			else if (seen[a]++)
				rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
						      "shard %" PRIu32 " of %s is given twice", a,
						      paths[0]);
			if (rc) {
				free(seen);
				return rc;
			}
		}
		free(seen);
	}
	/* The whole series, in order, named from the stem; every shard must be there. */
	char **p = calloc(total, sizeof(*p));
	if (!p)
		return nomem(err);
	int rc = 0;
	for (uint32_t i = 0; i < total && !rc; i++)
		if (!(p[i] = series_name(paths[0], stem_len, i + 1, total)))
			rc = nomem(err);
	if (!rc)
		rc = check_no_extra(paths[0], stem_len, total, err);
	if (rc) {
		for (uint32_t i = 0; i < total; i++)
			free(p[i]);
		free(p);
		return rc;
	}
	*out = p;
	*n = total;
	return 0;
}

static uint64_t set_hash(const kiln_set *set, const char *name, size_t len)
{
	return kiln__name_hash(set->secret, name, len);
}

static const kiln_tensor *slot_tensor(const kiln_set *set, uint64_t v, uint32_t *shard)
{
	uint32_t s = (uint32_t)((v - 1) >> 32);
	if (shard)
		*shard = s;
	return kiln_dir_tensor(set->dirs[s], (uint32_t)(v - 1));
}

/* The slot holding `name` (hash h), or the empty slot where it would go. */
static uint64_t find_slot(const kiln_set *set, uint64_t h, const char *name, size_t len)
{
	for (uint64_t s = h & set->slot_mask;; s = (s + 1) & set->slot_mask) {
		const struct set_slot *e = &set->slots[s];
		if (!e->ref)
			return s;
		if (e->hash != h)
			continue;
		const kiln_tensor *t = slot_tensor(set, e->ref, NULL);
		if (t->name_len == len && kiln__same_bytes(t->name, name, len))
			return s;
	}
}

/* One table over every named tensor; a name in two shards is an error naming both files. A set
 * of one file uses the directory's own table: a second one over the same names made opening a
 * set of one 300-tensor file cost 1.7 times a kiln_dir_open of it. */
static int build_names(kiln_set *set, kiln_error *err)
{
	if (set->n == 1)
		return 0;
	uint64_t named = 0;
	for (uint32_t s = 0; s < set->n; s++) {
		kiln_dir_info info;
		kiln_dir_get_info(set->dirs[s], &info);
		if (info.flags & KILN_FLAG_NAMES)
			named += info.tensor_count;
	}
	if (!named)
		return 0;
	uint64_t table = 2;
	while (table < 2 * named)
		table *= 2;
	/* Large tables in huge pages: one fault instead of one per 4 KiB, and fewer TLB misses
	 * for probes that land anywhere. */
	set->slots_bytes = (size_t)table * sizeof(*set->slots);
	set->slots = kiln__owned_zalloc(set->slots_bytes);
	if (!set->slots)
		return nomem(err);
	set->slot_mask = table - 1;
	kiln__hash_key(set->secret);
	/* In batches: hash a batch of names and prefetch their slots, then insert them, so the
	 * table's cache misses overlap instead of coming one after another. */
	enum { BATCH = 16 };
	uint64_t hashes[BATCH];
	for (uint32_t s = 0; s < set->n; s++) {
		uint32_t count = kiln_dir_count(set->dirs[s]);
		for (uint32_t base = 0; base < count; base += BATCH) {
			uint32_t m = count - base < BATCH ? count - base : BATCH;
			for (uint32_t k = 0; k < m; k++) {
				const kiln_tensor *t = kiln_dir_tensor(set->dirs[s], base + k);
				hashes[k] = t->name ? set_hash(set, t->name, t->name_len) : 0;
				__builtin_prefetch(&set->slots[hashes[k] & set->slot_mask], 1);
			}
			for (uint32_t k = 0; k < m; k++) {
				uint32_t i = base + k;
				const kiln_tensor *t = kiln_dir_tensor(set->dirs[s], i);
				if (!t->name)
					continue;
				uint64_t h = hashes[k];
				uint64_t slot = find_slot(set, h, t->name, t->name_len);
				uint64_t v = set->slots[slot].ref;
				if (v) {
					uint32_t other;
					slot_tensor(set, v, &other);
					return kiln__fail(
					    err, KILN_TYPE, i, "name", KILN_NO_OFFSET,
					    "%s: tensor %" PRIu32 " has the name of tensor %" PRIu32
					    " of %s: a name must be in one shard only",
					    set->paths[s], i, (uint32_t)(v - 1), set->paths[other]);
				}
				set->slots[slot] =
				    (struct set_slot){h, ((uint64_t)s << 32 | i) + 1};
			}
		}
	}
	return 0;
}

void kiln_set_close(kiln_set *set)
{
	if (!set)
		return;
	for (uint32_t i = 0; i < set->n; i++) {
		kiln_dir_close(set->dirs ? set->dirs[i] : NULL);
		free(set->paths ? set->paths[i] : NULL);
	}
	free(set->dirs);
	free(set->paths);
	free(set->first);
	kiln__owned_free(set->slots, set->slots_bytes);
	free(set);
}

int kiln_set_open(const char *const *paths, uint32_t count, const kiln_open_options *opts,
		  kiln_set **out, kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "out is NULL");
	*out = NULL;
	if (!paths || count == 0)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "no paths");
	for (uint32_t i = 0; i < count; i++)
		if (!paths[i])
			return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
						"path %" PRIu32 " is NULL", i);
	kiln_set *set = calloc(1, sizeof(*set));
	if (!set)
		return nomem(err);
	int rc = resolve_paths(paths, count, &set->paths, &set->n, err);
	if (rc) {
		free(set);
		return rc;
	}
	set->dirs = calloc(set->n, sizeof(*set->dirs));
	set->first = calloc((size_t)set->n + 1, sizeof(*set->first));
	if (!set->dirs || !set->first)
		rc = nomem(err);
	for (uint32_t i = 0; !rc && i < set->n; i++) {
		rc = kiln_dir_open(set->paths[i], opts, &set->dirs[i], err);
		if (rc == KILN_IO && err && err->sys_errno == ENOENT && set->n > 1)
			snprintf(err->message, sizeof(err->message),
				 "%s: shard %" PRIu32 " of %" PRIu32 " is missing", set->paths[i],
				 i + 1, set->n);
		else if (rc && err && kiln_is_format_error(rc) && set->n > 1) {
			/* Say which shard: the directory's own message names no file. Cut to fit
			 * like every message. */
			char msg[2 * sizeof(err->message)];
			snprintf(msg, sizeof(msg), "%s: %s", set->paths[i], err->message);
			memcpy(err->message, msg, sizeof(err->message) - 1);
			err->message[sizeof(err->message) - 1] = '\0';
		}
		if (!rc) {
			set->first[i] = set->count;
			set->count += kiln_dir_count(set->dirs[i]);
		}
	}
	if (!rc) {
		set->first[set->n] = set->count;
		rc = build_names(set, err);
	}
	if (rc) {
		kiln_set_close(set);
		return rc;
	}
	*out = set;
	return 0;
}

uint32_t kiln_set_shards(const kiln_set *set)
{
	return set ? set->n : 0;
}

kiln_dir *kiln_set_shard(const kiln_set *set, uint32_t shard)
{
	return set && shard < set->n ? set->dirs[shard] : NULL;
}

const char *kiln_set_path(const kiln_set *set, uint32_t shard)
{
	return set && shard < set->n ? set->paths[shard] : NULL;
}

uint64_t kiln_set_count(const kiln_set *set)
{
	return set ? set->count : 0;
}

const kiln_tensor *kiln_set_tensor(const kiln_set *set, uint64_t index, uint32_t *shard)
{
	if (!set || index >= set->count)
		return NULL;
	/* The last shard whose first index is <= index: its range holds it (empty shards share
	 * their first index with the next one, and the search passes them). */
	uint32_t lo = 0, hi = set->n;
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (set->first[mid] <= index)
			lo = mid;
		else
			hi = mid;
	}
	if (shard)
		*shard = lo;
	return kiln_dir_tensor(set->dirs[lo], (uint32_t)(index - set->first[lo]));
}

const kiln_tensor *kiln_set_find(const kiln_set *set, const char *name, size_t len, uint32_t *shard)
{
	if (set && set->n == 1) {
		const kiln_tensor *t = kiln_dir_find(set->dirs[0], name, len);
		if (t && shard)
			*shard = 0;
		return t;
	}
	if (!set || !set->slots || (!name && len))
		return NULL;
	uint64_t h = set_hash(set, name, len);
	uint64_t v = set->slots[find_slot(set, h, name, len)].ref;
	return v ? slot_tensor(set, v, shard) : NULL;
}

const kiln_tensor *kiln_set_find_cstr(const kiln_set *set, const char *name, uint32_t *shard)
{
	return name ? kiln_set_find(set, name, strlen(name), shard) : NULL;
}

int kiln_set_stream(const kiln_set *set, const uint64_t *tensors, uint32_t count,
		    void *const *dests, const kiln_stream_options *opts, kiln_stream_result *result,
		    kiln_error *err)
{
	kiln__clear_error(err);
	if (result)
		memset(result, 0, sizeof(*result));
	if (!set)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "set is NULL");
	uint64_t n = tensors ? count : set->count;
	if (set->count > UINT32_MAX)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, NULL,
		    "a set of %" PRIu64 " tensors: chunks name tensors with 32 bits", set->count);
	int *fds = calloc(set->n, sizeof(*fds));
	struct kiln__range *ranges = calloc(n ? (size_t)n : 1, sizeof(*ranges));
	int rc = !fds || !ranges ? nomem(err) : 0;
	for (uint32_t s = 0; !rc && s < set->n; s++)
		fds[s] = set->dirs[s]->fd;
	for (uint64_t k = 0; !rc && k < n; k++) {
		uint64_t i = tensors ? tensors[k] : k;
		uint32_t shard;
		const kiln_tensor *t = kiln_set_tensor(set, i, &shard);
		if (!t)
			rc = kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					      "tensor %" PRIu64 " is out of range (count %" PRIu64
					      ")",
					      i, set->count);
		else if (dests && !dests[k] && t->byte_length)
			rc = kiln__fail_inval(err, (uint32_t)i, NULL,
					      "destination %" PRIu64 " is NULL", k);
		else
			ranges[k] = (struct kiln__range){.off = t->file_offset,
							 .len = t->byte_length,
							 .dst = dests ? dests[k] : NULL,
							 .tensor = (uint32_t)i,
							 .file = shard};
	}
	if (!rc)
		rc = kiln__stream_files(fds, set->n, ranges, (size_t)n, dests, opts, result, err);
	free(fds);
	free(ranges);
	return rc;
}

/* A shard's failure, told in the set's terms: the set index, and the shard's file. */
static int shard_failed(const kiln_set *set, uint32_t shard, uint64_t index, int rc,
			kiln_error *err)
{
	if (err) {
		char msg[2 * sizeof(err->message)];
		snprintf(msg, sizeof(msg), "%s: %s", set->paths[shard], err->message);
		memcpy(err->message, msg, sizeof(err->message) - 1);
		err->message[sizeof(err->message) - 1] = '\0';
		err->tensor = index > UINT32_MAX ? KILN_NO_INDEX : (uint32_t)index;
	}
	return rc;
}

/* Tensor `index` of the set: its shard and index there, or INVAL. */
static int locate(const kiln_set *set, uint64_t index, uint32_t *shard, uint32_t *local,
		  kiln_error *err)
{
	if (!set)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "set is NULL");
	const kiln_tensor *t = kiln_set_tensor(set, index, shard);
	if (!t)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"tensor %" PRIu64 " is out of range (count %" PRIu64 ")",
					index, set->count);
	*local = t->index;
	return 0;
}

int kiln_set_hint(const kiln_set *set, const uint64_t *tensors, uint32_t count, unsigned hint,
		  kiln_error *err)
{
	kiln__clear_error(err);
	if (!set || (!tensors && count))
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "set or tensors is NULL");
	/* Every index is checked before any advice is given, so a bad list changes nothing. */
	for (uint32_t k = 0; k < count; k++) {
		uint32_t shard, local;
		int rc = locate(set, tensors[k], &shard, &local, err);
		if (rc)
			return rc;
	}
	for (uint32_t k = 0; k < count; k++) {
		uint32_t shard, local;
		locate(set, tensors[k], &shard, &local, NULL);
		int rc = kiln_tensor_hint(set->dirs[shard], &local, 1, hint, err);
		if (rc)
			return shard_failed(set, shard, tensors[k], rc, err);
	}
	return 0;
}

int kiln_set_copy(const kiln_set *set, uint64_t index, void *dst, size_t cap, kiln_error *err)
{
	kiln__clear_error(err);
	uint32_t shard = 0, local = 0;
	int rc = locate(set, index, &shard, &local, err);
	if (!rc && (rc = kiln_tensor_copy(set->dirs[shard], local, dst, cap, err)))
		return shard_failed(set, shard, index, rc, err);
	return rc;
}

int kiln_set_pin(kiln_set *set, uint64_t index, const kiln_pin_hooks *hooks, kiln_error *err)
{
	kiln__clear_error(err);
	uint32_t shard = 0, local = 0;
	int rc = locate(set, index, &shard, &local, err);
	if (!rc && (rc = kiln_tensor_pin(set->dirs[shard], local, hooks, err)))
		return shard_failed(set, shard, index, rc, err);
	return rc;
}

int kiln_set_unpin(kiln_set *set, uint64_t index, kiln_error *err)
{
	kiln__clear_error(err);
	uint32_t shard = 0, local = 0;
	int rc = locate(set, index, &shard, &local, err);
	if (!rc && (rc = kiln_tensor_unpin(set->dirs[shard], local, err)))
		return shard_failed(set, shard, index, rc, err);
	return rc;
}
