/* SPDX-License-Identifier: MIT */
/*
 * KLNT output of any size: one file, or when the names cannot share one name heap (its 16-bit
 * offsets) or max_shard_size asks for smaller files, a series STEM-00001-of-0000N.klnt beside
 * the path (names from kiln_series_name), published together (src/base/publish.h). Every shard is
 * a standalone valid file, the block kiln_write_file() writes; the metadata document, when given,
 * is the last tensor of the first shard (docs/convert.md). `klnt import` and Python's
 * kiln.save_file both write through here.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sys.h"
#include "write/write.h"

#define NAME_LIMIT    0xFFFFu /* heap slices must start below this offset (u16, 0xFFFF = none) */
#define META_NAME_LEN (sizeof(KILN_METADATA_TENSOR) - 1)
#define DIG_NAME_LEN  (sizeof(KILN_DIGESTS_TENSOR) - 1)

static uint64_t align64_sat(uint64_t x)
{
	return x > UINT64_MAX - 63 ? UINT64_MAX : (x + 63) & ~(uint64_t)63;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ----------------------------------------------------------------------------------------------
 * Planning the shards
 * -------------------------------------------------------------------------------------------- */

struct shard {
	uint32_t first, n; /* a run of plan.order */
	uint64_t names;    /* heap bytes of the tensor names (the metadata name included) */
	uint64_t layouts;  /* heap bytes of the layout names */
	/* The last heap slice of each kind is the one of the shard's highest-indexed tensor that
	 * has one (a shard is written in the caller's order, and a group may pull a later tensor
	 * in): its index (KILN_NONE32: none yet) and length. */
	uint32_t name_at, layout_at;
	uint32_t last_name, last_layout;
	uint64_t payload; /* aligned payload bytes */
};

struct plan {
	uint32_t *order;    /* tensor indices, shard by shard, each shard in the caller's order */
	uint32_t *shard_of; /* per tensor: its shard */
	uint32_t *group;    /* per tensor: the first tensor of its quantization group; once
			     * planned, its index within its shard */
	struct shard *shards;
	uint32_t nshards;
};

static void plan_free(struct plan *p)
{
	free(p->order);
	free(p->shard_of);
	free(p->group);
	free(p->shards);
}

static uint32_t find(uint32_t *g, uint32_t i)
{
	while (g[i] != i)
		i = g[i] = g[g[i]];
	return i;
}

/* Would the heap of shard s start every slice below 0xFFFF? The heap is the names in order,
 * then the layout names; `tail`, when nonzero, is the length of the last name, one of kiln's
 * own (the digest table's in every shard, else the metadata document's in shard 0). */
static int heap_fits(const struct shard *s, uint64_t tail)
{
	uint64_t last_name_at = s->names - (tail ? tail : s->last_name);
	if (s->names && last_name_at >= NAME_LIMIT)
		return 0;
	return !s->layouts || s->names + s->layouts - s->last_layout < NAME_LIMIT;
}

/* The payload bytes of t as the writer will count them: byte_length, or for a plain dtype given
 * 0, the length its shape computes (the writer checks the rest). */
static uint64_t payload_of(const kiln_tensor_spec *t)
{
	uint64_t count, bytes;
	unsigned bits = kiln_dtype_bits(t->dtype);
	if (t->byte_length || !bits || t->rank > KILN_MAX_RANK ||
	    kiln__element_count(t->shape, t->rank, &count) ||
	    kiln__payload_bytes(count, bits, &bytes))
		return t->byte_length;
	return bytes;
}

static void shard_add(struct shard *s, const kiln_tensor_spec *t, uint32_t i, int fixed_last)
{
	if (t->name && t->name_len) {
		s->names += t->name_len;
		if (!fixed_last && (s->name_at == KILN_NONE32 || i > s->name_at)) {
			s->name_at = i;
			s->last_name = (uint32_t)t->name_len;
		}
	}
	if (t->layout && t->layout_len) {
		s->layouts += t->layout_len;
		if (s->layout_at == KILN_NONE32 || i > s->layout_at) {
			s->layout_at = i;
			s->last_layout = (uint32_t)t->layout_len;
		}
	}
	s->payload = sat_add(s->payload, align64_sat(payload_of(t)));
}

/* A shard from tensor `first` on; `names`: the heap bytes of kiln's own tensors in it. */
static void shard_start(struct shard *s, uint32_t first, uint64_t names)
{
	*s = (struct shard){
	    .first = first, .names = names, .name_at = KILN_NONE32, .layout_at = KILN_NONE32};
}

static int links_of(const kiln_tensor_spec *t, uint32_t links[2])
{
	links[0] = links[1] = KILN_NONE32;
	if (t->quant_scheme == KILN_QUANT_BLOCK || t->quant_scheme == KILN_QUANT_BLOCK_OUTER)
		links[0] = t->scale_index;
	if (t->quant_scheme == KILN_QUANT_BLOCK_OUTER)
		links[1] = t->outer_index;
	return links[0] != KILN_NONE32 || links[1] != KILN_NONE32;
}

/*
 * Greedy, in the caller's order: a tensor starts a new shard when its quantization group (the
 * tensor with its scale and outer tensors) would push the current shard's heap past the 16-bit
 * offsets or its payload past max_shard. A group that does not fit an empty shard still gets one
 * (the writer then says why it cannot be written), except the first shard when it holds the
 * metadata document: that one is then left with the document alone. Members of a group after its
 * first tensor are placed with it, so a shard's tensors stay in order but a group may pull a
 * later tensor forward.
 */
static int plan_shards(const kiln_tensor_spec *ts, uint32_t n, int has_meta, uint64_t meta_len,
		       int digests, uint64_t max_shard, struct plan *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	p->order = malloc((n ? n : 1) * sizeof(uint32_t));
	p->shard_of = malloc((n ? n : 1) * sizeof(uint32_t));
	p->group = malloc((n ? n : 1) * sizeof(uint32_t));
	p->shards = calloc((size_t)n + 1, sizeof(struct shard)); /* one more: metadata alone */
	uint32_t *next = malloc((n ? n : 1) * sizeof(uint32_t)), *fill = NULL;
	int rc = 0;
	if (!p->order || !p->shard_of || !p->group || !p->shards || !next) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		p->group[i] = i;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t links[2];
		if (!links_of(&ts[i], links))
			continue;
		for (int k = 0; k < 2; k++) {
			if (links[k] == KILN_NONE32)
				continue;
			if (links[k] >= n) {
				rc = kiln__fail(err, KILN_TYPE, i,
						k ? "outer_index" : "scale_index", KILN_NO_OFFSET,
						"tensor %" PRIu32 ": %s %" PRIu32
						" is not one of the %" PRIu32 " tensors",
						i, k ? "outer_index" : "scale_index", links[k], n);
				goto out;
			}
			uint32_t a = find(p->group, i), b = find(p->group, links[k]);
			if (a != b)
				p->group[a > b ? a : b] = a < b ? a : b;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		p->group[i] = find(p->group, i);

	/* Each group as a list from its first (smallest) tensor: next[j] is the next member. */
	uint32_t *head = p->order;
	for (uint32_t i = 0; i < n; i++)
		head[i] = KILN_NONE32;
	for (uint32_t i = n; i-- > 0;) {
		next[i] = head[p->group[i]];
		head[p->group[i]] = i;
	}

	/* Every shard ends with its digest table (unless none are written), the first one with
	 * the metadata document before it: names the heap must hold, the last one fixed. */
	const uint64_t dig = digests ? DIG_NAME_LEN : 0;
	struct shard *cur = &p->shards[0];
	shard_start(cur, 0, dig + (has_meta ? META_NAME_LEN : 0));
	p->nshards = 1;
	if (has_meta)
		cur->payload = align64_sat(meta_len);
	uint32_t placed = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (p->group[i] != i)
			continue; /* placed with the first tensor of its group */
		int meta_last = has_meta && cur == &p->shards[0];
		uint64_t tail = dig ? dig : meta_last ? META_NAME_LEN : 0;
		struct shard try = *cur;
		uint32_t members = 0;
		for (uint32_t j = i; j != KILN_NONE32; j = next[j])
			shard_add(&try, &ts[j], j, tail != 0), members++;
		int fits = heap_fits(&try, tail);
		int too_big = max_shard && try.payload > max_shard;
		/* A shard holding tensors closes when the group does not fit. The first one, with
		 * only the metadata document yet, closes when the names do not fit, or when the
		 * group would fit max_shard on its own but not beside the document (a group larger
		 * than max_shard stays with it: it needs a shard past max_shard either way). */
		uint64_t group = try.payload - cur->payload;
		if ((cur->n && (!fits || too_big)) ||
		    (meta_last && !cur->n && (!fits || (too_big && group <= max_shard)))) {
			cur = &p->shards[p->nshards++];
			shard_start(cur, placed, dig);
			try = *cur;
			for (uint32_t j = i; j != KILN_NONE32; j = next[j])
				shard_add(&try, &ts[j], j, dig != 0);
		}
		*cur = try;
		cur->n += members;
		for (uint32_t j = i; j != KILN_NONE32; j = next[j])
			p->shard_of[j] = (uint32_t)(cur - p->shards);
		placed += members;
	}
	/* The order: shard by shard, the caller's order within each. */
	if (!(fill = calloc(p->nshards, sizeof(uint32_t)))) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = p->shard_of[i];
		p->group[i] = fill[s];
		p->order[p->shards[s].first + fill[s]++] = i;
	}
out:
	free(next);
	free(fill);
	return rc;
}

/* ----------------------------------------------------------------------------------------------
 * Writing
 * -------------------------------------------------------------------------------------------- */

/* A shard's read callbacks call the caller's with the tensor's index in the caller's array. */
struct feed {
	const kiln_tensor_spec *ts;
	const uint32_t *order; /* the shard's tensors: indices in ts */
};

static int feed_read(void *ctx, uint32_t i, uint64_t off, void *buf, size_t len)
{
	const struct feed *f = ctx;
	const kiln_tensor_spec *t = &f->ts[f->order[i]];
	return t->read(t->read_ctx, f->order[i], off, buf, len);
}

/* Shard k's tensor list: the caller's specs, links as indices within the shard, the metadata
 * document last in shard 0. */
static kiln_tensor_spec *shard_specs(const kiln_tensor_spec *ts, const struct plan *p, uint32_t k,
				     const kiln_series_options *o, struct feed *f, uint32_t *count)
{
	const struct shard *s = &p->shards[k];
	int meta = k == 0 && o && o->metadata;
	uint32_t n = s->n + (uint32_t)meta;
	kiln_tensor_spec *specs = calloc(n ? n : 1, sizeof(*specs));
	if (!specs)
		return NULL;
	f->ts = ts;
	f->order = p->order + s->first;
	for (uint32_t i = 0; i < s->n; i++) {
		const kiln_tensor_spec *t = &ts[p->order[s->first + i]];
		specs[i] = *t;
		if (!t->data && t->read) {
			specs[i].read = feed_read;
			specs[i].read_ctx = f;
		}
		uint32_t links[2];
		if (links_of(t, links)) {
			/* A group is never split, so its links land in this shard. */
			if (links[0] != KILN_NONE32)
				specs[i].scale_index = p->group[links[0]];
			if (links[1] != KILN_NONE32)
				specs[i].outer_index = p->group[links[1]];
		}
	}
	if (meta)
		specs[s->n] = (kiln_tensor_spec){.name = KILN_METADATA_TENSOR,
						 .name_len = META_NAME_LEN,
						 .dtype = KILN_DT_U8,
						 .rank = 1,
						 .shape = {o->metadata_len},
						 .byte_length = o->metadata_len,
						 .data = o->metadata};
	*count = n;
	return specs;
}

static size_t stem_len_of(const char *path)
{
	size_t len = strlen(path);
	return len > 5 && !strcmp(path + len - 5, ".klnt") ? len - 5 : len;
}

/* PATH itself for one file; STEM-0000k-of-0000N.klnt beside it for a series. */
static char *shard_path(const char *path, uint32_t k, uint32_t n)
{
	if (n == 1)
		return strdup(path);
	size_t stem = stem_len_of(path), cap = stem + sizeof("-00000-of-00000.klnt");
	char *s = malloc(cap);
	if (s && !kiln_series_name(s, cap, path, stem, k + 1, n, ".klnt")) {
		free(s);
		s = NULL;
	}
	return s;
}

/* Is `name` a file an earlier write to PATH may have left that this one (nshards files) did not
 * replace: PATH itself when a series was written, or STEM-NNNNN-of-MMMMM.klnt with a count other
 * than nshards? `base` is PATH's last component, `stem_len` the length of its stem. */
static int stale_name(const char *name, const char *base, size_t stem_len, uint32_t nshards)
{
	if (!strcmp(name, base))
		return nshards > 1;
	uint32_t n;
	const char *ext;
	size_t sl = kiln_series_parse(name, NULL, &n, &ext);
	return sl && sl == stem_len && !strncmp(name, base, stem_len) && !strcmp(ext, ".klnt") &&
	       (nshards == 1 || n != nshards);
}

/* What an earlier write to PATH left that this one (nshards files) does not replace: remove it
 * after a successful write (only regular files that open as valid KLNT files, never one of
 * `keep`'s; best effort), or with `dry`, count what would stay (a file of `keep`, one that is no
 * valid KLNT, a symlink, a directory...): beside a new series of another count such a file would
 * make the series ambiguous, so the write is refused before it starts. *blocker gets the first
 * such name (freed by the caller). Returns how many were removed, or would stay. */
static uint32_t stale_files(const kiln_model *keep, const char *path, uint32_t nshards,
			    uint32_t flags, int dry, char **blocker)
{
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	size_t stem_len = stem_len_of(base);
	char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
	DIR *d = dir ? opendir(dir) : NULL;
	if (!d) {
		free(dir);
		return 0;
	}
	uint32_t n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!stale_name(e->d_name, base, stem_len, nshards) ||
		    (dry && !strcmp(e->d_name, base)))
			continue; /* PATH beside a series makes nothing ambiguous */
		struct stat st;
		char *full = NULL;
		if (asprintf(&full, "%s/%s", dir, e->d_name) < 0)
			continue;
		int regular =
		    !fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) && S_ISREG(st.st_mode);
		kiln_model *k = NULL;
		kiln_open_options one = {.flags = KILN_OPEN_ONE_FILE};
		int removable = regular && !(keep && kiln_model_has_file(keep, full)) &&
				!kiln_model_open(full, &one, &k, NULL);
		kiln_model_close(k);
		if (dry && !removable && nshards > 1) {
			if (!n++ && blocker)
				*blocker = full, full = NULL;
		} else if (!dry && removable) {
			n += !unlinkat(dirfd(d), e->d_name, 0);
		}
		free(full);
	}
	/* The removals are as durable as the files written (a crash may still bring one back). */
	if (!dry && n && !(flags & KILN_WRITE_NO_SYNC))
		kiln__sys.fsync(dirfd(d));
	closedir(d);
	free(dir);
	return n;
}

/* The final names of a series must be free or regular files to replace: a directory, a device
 * or a symlink there would fail the last renames, after some shards were in place. */
static int check_finals(char *const *finals, uint32_t n, kiln_error *err)
{
	for (uint32_t i = 0; i < n; i++) {
		struct stat st;
		if (lstat(finals[i], &st) != 0)
			continue;
		if (!S_ISREG(st.st_mode))
			return kiln__fail_sys(err, KILN_IO, S_ISDIR(st.st_mode) ? EISDIR : EEXIST,
					      "%s: shard %" PRIu32 " of %" PRIu32
					      " would replace something that is not a regular file",
					      finals[i], i + 1, n);
	}
	return 0;
}

/* A refusal of kiln_write_size for shard k names the tensor by the caller's index. */
static void name_the_tensor(kiln_error *err, const kiln_tensor_spec *specs, uint32_t n,
			    const struct plan *p, uint32_t k)
{
	if (!err || err->tensor >= n || err->tensor >= p->shards[k].n)
		return;
	uint32_t g = p->order[p->shards[k].first + (uint32_t)err->tensor];
	const kiln_tensor_spec *t = &specs[err->tensor];
	char msg[sizeof(err->message)], nb[KILN__SHOWN];
	/* The writer's own "descriptor N: " gives the index in the shard: left out. */
	const char *m = err->message;
	static const char pre[] = "descriptor ";
	if (!strncmp(m, pre, sizeof(pre) - 1)) {
		const char *q = m + sizeof(pre) - 1;
		while (*q >= '0' && *q <= '9')
			q++;
		if (q[0] == ':' && q[1] == ' ')
			m = q + 2;
	}
	snprintf(msg, sizeof(msg), "%s", m);
	err->tensor = g;
	if (!t->name)
		return;
	/* The name first; the writer's message after it, cut to what is left. */
	int at = snprintf(err->message, sizeof(err->message),
			  "tensor %s: ", kiln__shown(t->name, t->name_len, nb));
	if (at <= 0 || (size_t)at >= sizeof(err->message))
		return;
	size_t room = sizeof(err->message) - (size_t)at, len = strnlen(msg, room - 1);
	memcpy(err->message + at, msg, len);
	err->message[(size_t)at + len] = '\0';
}

int kiln_write_series(const char *path, const kiln_tensor_spec *tensors, uint64_t count,
		      const kiln_series_options *opts, kiln_series_result *res, kiln_error *err)
{
	kiln__clear_error(err);
	if (res)
		memset(res, 0, sizeof(*res));
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (count && !tensors)
		return kiln__fail_inval(err, KILN_NO_INDEX, "tensors",
					"tensors is NULL with a count of %" PRIu64, count);
	int rc = opts ? kiln__check_size("kiln_series_options", opts->size, sizeof(*opts), err) : 0;
	if (rc)
		return rc;
	uint32_t flags = opts ? opts->flags : 0;
	if (flags & ~(uint32_t)KILN__WRITE_FLAGS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	if (opts && !opts->metadata && opts->metadata_len)
		return kiln__fail_inval(err, KILN_NO_INDEX, "metadata",
					"metadata is NULL with a length of %zu",
					opts->metadata_len);
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (!stem_len_of(base) || !strcmp(base, ".klnt"))
		return kiln__fail_inval(err, KILN_NO_INDEX, "path",
					"%s: no file name to write (or to name a series after)",
					path);
	uint32_t no, total;
	const char *ext;
	size_t stem = kiln_series_parse(path, &no, &total, &ext);
	if (stem)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "path",
		    "%s: named like shard %" PRIu32 " of %" PRIu32
		    " of a series, which readers would look for whole; name it "
		    "%.*s%s (a series, when one is needed, is written beside it)",
		    path, no, total, (int)stem, path, ext);
	/* A shard holds at most 2^32 - 2 tensors; a series of 99,999 of them is the limit. */
	if (count >= (uint64_t)KILN_NONE32 * KILN__SERIES_MAX)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "count", KILN_NO_OFFSET,
				  "%" PRIu64 " tensors: more than a series holds", count);
	if (count >= KILN_NONE32)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "count", KILN_NO_OFFSET,
				  "%" PRIu64 " tensors: more than this writer plans (2^32 - 1)",
				  count);
	uint32_t n = (uint32_t)count;
	int has_meta = opts && opts->metadata;
	int unnamed = 0;
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *t = &tensors[i];
		unnamed |= !t->name;
		if (!(flags & KILN_WRITE_NO_DIGESTS) && t->name && t->name_len == DIG_NAME_LEN &&
		    !memcmp(t->name, KILN_DIGESTS_TENSOR, DIG_NAME_LEN))
			return kiln__fail(err, KILN_TYPE, i, "name", KILN_NO_OFFSET,
					  "tensor %" PRIu32 ": the name %s is the digest table's "
					  "(KILN_WRITE_NO_DIGESTS writes the tensors alone)",
					  i, KILN_DIGESTS_TENSOR);
		if (has_meta && t->name && t->name_len == META_NAME_LEN &&
		    !memcmp(t->name, KILN_METADATA_TENSOR, META_NAME_LEN))
			return kiln__fail(err, KILN_TYPE, i, "name", KILN_NO_OFFSET,
					  "tensor %" PRIu32 ": the name %s is the metadata "
					  "document's",
					  i, KILN_METADATA_TENSOR);
	}

	struct plan plan;
	kiln_error unsynced = {0};
	char **finals = NULL; /* where the shards go */
	struct kiln__pending *pend = NULL;
	const kiln_model *keep = opts ? opts->keep : NULL;
	/* Unnamed tensors are one file, which has no digest table (its name would be the only
	 * one). */
	int digests = !(flags & KILN_WRITE_NO_DIGESTS) && n && !unnamed;
	rc = plan_shards(tensors, n, has_meta, has_meta ? opts->metadata_len : 0, digests,
			 opts ? opts->max_shard_size : 0, &plan, err);
	if (rc)
		goto out;
	if (plan.nshards > 1 && unnamed) {
		rc = kiln__fail_inval(err, KILN_NO_INDEX, "tensors",
				      "%s: unnamed tensors cannot be split into a series (a series "
				      "is one namespace)",
				      path);
		goto out;
	}
	if (plan.nshards > KILN__SERIES_MAX) {
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "count", KILN_NO_OFFSET,
				"%s: %" PRIu32 " shards, more than 99999", path, plan.nshards);
		goto out;
	}
	if (has_meta && unnamed) {
		rc = kiln__fail_inval(err, KILN_NO_INDEX, "metadata",
				      "%s: a metadata document needs named tensors (its own is "
				      "named)",
				      path);
		goto out;
	}
	if (!(pend = calloc(plan.nshards, sizeof(*pend))) ||
	    !(finals = calloc(plan.nshards, sizeof(char *)))) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	for (uint32_t k = 0; k < plan.nshards; k++)
		if (!(finals[k] = shard_path(path, k, plan.nshards))) {
			rc = kiln__nomem(err, 0, NULL);
			goto out;
		}
	/* Everything that could stop the write part-way is ruled out before the first byte: the
	 * inputs' files among the names, names that cannot be replaced, an earlier series that
	 * would stay beside the new one, and every shard's tensors (kiln_write_size). */
	for (uint32_t k = 0; k < plan.nshards && !rc; k++)
		if (keep && kiln_model_has_file(keep, finals[k]))
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "path",
					      "%s: the output would replace an input file",
					      finals[k]);
	if (!rc && plan.nshards > 1)
		rc = check_finals(finals, plan.nshards, err);
	if (!rc && plan.nshards > 1) {
		char *blocker = NULL;
		uint32_t stays = stale_files(keep, path, plan.nshards, flags, 1, &blocker);
		if (stays)
			rc = kiln__fail_inval(
			    err, KILN_NO_INDEX, "path",
			    "%s: an earlier series of another count would stay beside the new one "
			    "(%" PRIu32
			    " file%s such as %s: an input, or no valid KLNT file, which "
			    "is never removed), and readers would find two",
			    path, stays, stays == 1 ? "" : "s", blocker ? blocker : "?");
		free(blocker);
	}
	for (uint32_t k = 0; k < plan.nshards && !rc; k++) {
		struct feed f;
		uint32_t sn;
		kiln_tensor_spec *specs = shard_specs(tensors, &plan, k, opts, &f, &sn);
		if (!specs) {
			rc = kiln__nomem(err, 0, NULL);
			break;
		}
		if ((rc = kiln__klnt_check(specs, sn, flags, err)))
			name_the_tensor(err, specs, sn, &plan, k);
		free(specs);
	}
	/* Each shard written and synced, unseen until the series is published whole: a shard of a
	 * series of several under a hidden name beside its own (so that nobody can create it
	 * beforehand, and two writers never share one), holding no descriptor; one file keeps its
	 * anonymous file to link straight to its name. A failure part-way (or an interruption)
	 * leaves an earlier output of the same path whole, not with its first shards replaced. */
	for (uint32_t k = 0; k < plan.nshards && !rc; k++) {
		struct feed f;
		uint32_t sn;
		kiln_tensor_spec *specs = shard_specs(tensors, &plan, k, opts, &f, &sn);
		if (!specs) {
			rc = kiln__nomem(err, 0, NULL);
			break;
		}
		rc = kiln__pending_create(&pend[k], finals[k], flags, err);
		if (!rc && (rc = kiln__write_klnt(&pend[k], specs, sn, flags, err)))
			name_the_tensor(err, specs, sn, &plan, k);
		if (!rc)
			rc = kiln__pending_seal(&pend[k], plan.nshards > 1, err);
		free(specs);
	}
	/* Publish the series: every shard is complete, so only a rename can fail now (the error
	 * says how many shards are in place). */
	if (!rc && (rc = kiln__publish(pend, plan.nshards, err)) == KILN_UNSYNCED) {
		/* In place and complete: the write goes on; the caller hears of it. */
		if (err)
			unsynced = *err;
		unsynced.code = KILN_UNSYNCED;
		rc = 0;
	}
	if (!rc && res) {
		res->files = plan.nshards;
		snprintf(res->first, sizeof(res->first), "%s", finals[0]);
	}
	if (!rc) {
		uint32_t removed = stale_files(keep, path, plan.nshards, flags, 0, NULL);
		if (res)
			res->removed = removed;
	}
	if (!rc && unsynced.code) {
		if (err)
			*err = unsynced;
		rc = KILN_UNSYNCED;
	}
out:
	/* Nothing left behind: a series is all or nothing (short of a failed rename, which says
	 * how many shards it had published). */
	for (uint32_t i = 0; pend && i < plan.nshards; i++)
		kiln__pending_drop(&pend[i]);
	for (uint32_t i = 0; finals && i < plan.nshards; i++)
		free(finals[i]);
	free(pend);
	free(finals);
	plan_free(&plan);
	if (rc && rc != KILN_UNSYNCED && res)
		memset(res, 0, sizeof(*res));
	return rc;
}
