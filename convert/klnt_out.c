/* SPDX-License-Identifier: MIT */
/*
 * The KLNT writer of the converters: a model's views as one KLNT file or, when the names cannot
 * share one name heap (its 16-bit offsets) or max_shard_size asks for smaller files, as a shard
 * series STEM-00001-of-0000N.klnt beside the output path (names from kiln_series_name), published
 * together. Every shard is a standalone valid file; the metadata document is the last tensor of
 * the first shard (docs/convert.md). Payloads stream from the model through kiln's read calls.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert_int.h"

#define NAME_LIMIT    0xFFFFu /* heap slices must start below this offset (u16, 0xFFFF = none) */
#define META_NAME_LEN (sizeof(KILN_METADATA_TENSOR) - 1)

/* At most this much of a name in a message (names may be 64 KiB long). */
#define SHOWN            80
#define SHORT(name, len) (int)((len) < SHOWN ? (len) : SHOWN), (name), ((len) > SHOWN ? "..." : "")

static uint64_t align64(uint64_t x)
{
	return x > UINT64_MAX - 63 ? UINT64_MAX : (x + 63) & ~(uint64_t)63;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Names are unique in a model (its name table says so); what KLNT needs besides: every tensor
 * named (a series is one namespace), and none named like the metadata tensor. */
static int check_names(const struct kc_list *l, kiln_error *err)
{
	for (uint64_t i = 0; i < l->n; i++) {
		const kiln_tensor *t = l->t[i];
		if (!t->name) {
			kiln_file_info fi;
			kiln_model_file_info(l->m, t->file, &fi);
			return kiln_error_set(err, KILN_UNSUPPORTED, 0,
					      "%s: tensor %" PRIu64
					      " has no name; only named tensors can be converted",
					      fi.path ? fi.path : "the model",
					      t->index - fi.first_tensor);
		}
		if (t->name_len == META_NAME_LEN &&
		    !memcmp(t->name, KILN_METADATA_TENSOR, META_NAME_LEN))
			return kiln_error_set(
			    err, KILN_TYPE, 0,
			    "tensor %s: the name is reserved for the metadata document",
			    KILN_METADATA_TENSOR);
	}
	return 0;
}

/* ----------------------------------------------------------------------------------------------
 * Planning the shards
 * -------------------------------------------------------------------------------------------- */

struct shard {
	uint32_t first, n; /* a run of plan.order */
	uint64_t names;    /* heap bytes of the tensor names (the metadata name included) */
	uint64_t layouts;  /* heap bytes of the layout names */
	uint32_t last_name, last_layout; /* lengths of the last heap slices of each kind */
	uint64_t payload;                /* aligned payload bytes */
};

struct plan {
	uint32_t *order;    /* model tensor indices, shard by shard, each shard in model order */
	uint32_t *shard_of; /* per model tensor: its shard */
	uint32_t *group;    /* per model tensor: the first tensor of its quantization group; once
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

/* Would the heap of shard s (plus tensor t) start every slice below 0xFFFF? The heap is the names
 * in order, then the layout names; the metadata name is the last name of shard 0. */
static int heap_fits(const struct shard *s, int first_shard)
{
	uint64_t last_name_at = s->names - (first_shard ? META_NAME_LEN : s->last_name);
	if (s->names && last_name_at >= NAME_LIMIT)
		return 0;
	return !s->layouts || s->names + s->layouts - s->last_layout < NAME_LIMIT;
}

static void shard_add(struct shard *s, const kiln_tensor *t, int first_shard)
{
	/* In shard 0 the metadata name stays last; the last model name does not matter. */
	s->names += t->name_len;
	if (!first_shard)
		s->last_name = (uint32_t)t->name_len;
	if (t->layout && t->layout_len) {
		s->layouts += t->layout_len;
		s->last_layout = (uint32_t)t->layout_len;
	}
	s->payload = sat_add(s->payload, align64(t->byte_length));
}

/*
 * Greedy, in tensor order: a tensor starts a new shard when its quantization group (the tensor
 * with its scale and outer tensors) would push the current shard's heap past the 16-bit offsets
 * or its payload past max_shard. A group that does not fit an empty shard still gets one (the
 * writer then says why it cannot be written), except the first shard, which holds the metadata
 * tensor: that one is then left with the metadata alone. Members of a group after its first tensor
 * are placed with it, so a shard's tensors stay in model order but a group may pull a later tensor
 * forward.
 */
static int plan_shards(const struct kc_list *l, const uint32_t *pos, uint64_t meta_len,
		       uint64_t max_shard, struct plan *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	uint32_t n = (uint32_t)l->n;
	uint64_t all = kiln_model_count(l->m);
	p->order = malloc((n ? n : 1) * sizeof(uint32_t));
	p->shard_of = malloc((n ? n : 1) * sizeof(uint32_t));
	p->group = malloc((n ? n : 1) * sizeof(uint32_t));
	p->shards = calloc(n + 1, sizeof(struct shard)); /* one more: metadata alone */
	if (!p->order || !p->shard_of || !p->group || !p->shards)
		return kc_nomem(err);
	for (uint32_t i = 0; i < n; i++)
		p->group[i] = i;
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor *t = l->t[i];
		if (!t->quant_scheme)
			continue;
		uint64_t links[2] = {t->scale_index, t->outer_index};
		for (int k = 0; k < 2; k++) {
			if (links[k] == KILN_NO_INDEX ||
			    (k && t->quant_scheme != KILN_QUANT_BLOCK_OUTER))
				continue;
			uint32_t at = links[k] < all ? pos[links[k]] : KILN_NONE32;
			if (at == KILN_NONE32)
				return kiln_error_set(err, KILN_TYPE, 0,
						      "tensor %.*s%s: %s %" PRIu64
						      " is not a tensor of the model",
						      SHORT(t->name, t->name_len),
						      k ? "outer_index" : "scale_index", links[k]);
			uint32_t a = find(p->group, i), b = find(p->group, at);
			if (a != b)
				p->group[a > b ? a : b] = a < b ? a : b;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		p->group[i] = find(p->group, i);

	/* Each group as a list from its first (smallest) tensor: next[j] is the next member. */
	uint32_t *next = malloc((n ? n : 1) * sizeof(uint32_t)), *head = p->order;
	if (!next)
		return kc_nomem(err);
	for (uint32_t i = 0; i < n; i++)
		head[i] = KILN_NONE32;
	for (uint32_t i = n; i-- > 0;) {
		next[i] = head[p->group[i]];
		head[p->group[i]] = i;
	}

	struct shard *cur = &p->shards[0];
	p->nshards = 1;
	cur->names = META_NAME_LEN;
	cur->payload = align64(meta_len);
	uint32_t placed = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (p->group[i] != i)
			continue; /* placed with the first tensor of its group */
		int first = cur == &p->shards[0];
		struct shard try = *cur;
		uint32_t members = 0;
		for (uint32_t j = i; j != KILN_NONE32; j = next[j])
			shard_add(&try, l->t[j], first), members++;
		/* Shard 1 may end up with the metadata alone, when the first names crowd it out. */
		int fits = heap_fits(&try, first);
		if ((cur->n && (!fits || (max_shard && try.payload > max_shard))) ||
		    (!fits && first)) {
			cur = &p->shards[p->nshards++];
			cur->first = placed;
			try = *cur;
			for (uint32_t j = i; j != KILN_NONE32; j = next[j])
				shard_add(&try, l->t[j], 0);
		}
		*cur = try;
		cur->n += members;
		for (uint32_t j = i; j != KILN_NONE32; j = next[j])
			p->shard_of[j] = (uint32_t)(cur - p->shards);
		placed += members;
	}
	free(next);
	/* The order: shard by shard, model order within each. */
	uint32_t *fill = calloc(p->nshards, sizeof(uint32_t));
	if (!fill)
		return kc_nomem(err);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = p->shard_of[i];
		p->group[i] = fill[s];
		p->order[p->shards[s].first + fill[s]++] = i;
	}
	free(fill);
	return 0;
}

/* ----------------------------------------------------------------------------------------------
 * Writing
 * -------------------------------------------------------------------------------------------- */

/* The read callbacks' context: one shard. A failure keeps its own message (naming the source
 * file and the tensor) for the caller, since the writer only knows the errno. */
struct feed {
	const struct kc_list *l;
	const uint32_t *order; /* the shard's tensors: positions in the list */
	struct kc_progress *p;
	kiln_error saved;
	int failed;
};

static int feed_read(void *ctx, uint32_t i, uint64_t off, void *buf, size_t len)
{
	struct feed *f = ctx;
	const kiln_tensor *t = f->l->t[f->order[i]];
	if (kc_read(f->l->m, t, off, buf, len, &f->saved)) {
		f->failed = 1;
		return f->saved.sys_errno ? f->saved.sys_errno : EIO;
	}
	if (kc_progress_add(f->p, len, &f->saved)) {
		f->failed = 1;
		return ECANCELED;
	}
	return 0;
}

static void spec_of(kiln_tensor_spec *s, const kiln_tensor *t)
{
	*s = (kiln_tensor_spec){.name = t->name,
				.name_len = t->name_len,
				.dtype = t->dtype,
				.rank = t->rank,
				.layout = t->layout,
				.layout_len = t->layout_len,
				.block_size = t->block_size,
				.quant_scheme = t->quant_scheme,
				.quant_axis = t->quant_axis,
				.group_size = t->group_size,
				.scale_index = KILN_NONE32,
				.outer_index = KILN_NONE32,
				.byte_length = t->byte_length};
	memcpy(s->shape, t->shape, sizeof(s->shape));
}

/* Build shard k's tensor list; quantization links become indices within the shard (`pos` maps a
 * model index to its list position). */
static int shard_specs(const struct kc_list *l, const uint32_t *pos, const struct plan *p,
		       uint32_t k, const char *meta, size_t meta_len, struct feed *f,
		       kiln_tensor_spec **out, uint32_t *count, kiln_error *err)
{
	const struct shard *s = &p->shards[k];
	uint32_t n = s->n + (k == 0);
	kiln_tensor_spec *specs = calloc(n ? n : 1, sizeof(*specs));
	if (!specs)
		return kc_nomem(err);
	for (uint32_t i = 0; i < s->n; i++) {
		const kiln_tensor *t = l->t[p->order[s->first + i]];
		spec_of(&specs[i], t);
		specs[i].read = feed_read;
		specs[i].read_ctx = f;
		if (t->quant_scheme) {
			/* A group is never split, so its links land in this shard. */
			specs[i].scale_index = p->group[pos[t->scale_index]];
			if (t->quant_scheme == KILN_QUANT_BLOCK_OUTER)
				specs[i].outer_index = p->group[pos[t->outer_index]];
		}
	}
	if (k == 0) {
		kiln_tensor_spec *ms = &specs[s->n];
		*ms = (kiln_tensor_spec){.name = KILN_METADATA_TENSOR,
					 .name_len = META_NAME_LEN,
					 .dtype = KILN_DT_U8,
					 .rank = 1,
					 .shape = {meta_len},
					 .byte_length = meta_len,
					 .data = meta};
	}
	*out = specs;
	*count = n;
	return 0;
}

/* The length of OUT's stem: OUT without its ".klnt". */
static size_t stem_len_of(const char *out)
{
	size_t len = strlen(out);
	return len > 5 && !strcmp(out + len - 5, ".klnt") ? len - 5 : len;
}

/* OUT itself for one file; STEM-0000k-of-0000N.klnt beside it for a series. */
static char *shard_path(const char *out, uint32_t k, uint32_t n)
{
	if (n == 1)
		return strdup(out);
	size_t stem = stem_len_of(out), cap = stem + sizeof("-00000-of-00000.klnt");
	char *s = malloc(cap);
	if (s && !kiln_series_name(s, cap, out, stem, k + 1, n, ".klnt")) {
		free(s);
		s = NULL;
	}
	return s;
}

/*
 * Where shard `final` is written before the series is published: a hidden name beside it, so
 * the last rename is within one file system. A series is published only once every shard is
 * written, so an import that fails part-way (or is interrupted) leaves an earlier series of the
 * same name whole, not with its first shards replaced. The ".kiln-tmp." prefix is what the
 * writer's own leftovers are called, for .gitignore files and cleanup scripts.
 */
static char *staging_path(const char *final)
{
	const char *slash = strrchr(final, '/');
	size_t dir = slash ? (size_t)(slash - final + 1) : 0;
	char *s = NULL;
	if (asprintf(&s, "%.*s.kiln-tmp.import-%ld-%s", (int)dir, final, (long)getpid(),
		     final + dir) < 0)
		return NULL;
	return s;
}

/* fsync the directory holding `path`: renames are durable only once it is. */
static int sync_dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, (size_t)(slash - path + 1)) : strdup(".");
	if (!dir)
		return -1;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (fd < 0)
		return -1;
	int rc = fsync(fd);
	close(fd);
	return rc;
}

/* Is `name` a file an earlier import to `out` may have written that this one (nshards files)
 * did not replace: OUT itself when a series was written, or STEM-NNNNN-of-MMMMM.klnt with a
 * count MMMMM other than nshards? `base` is OUT's last component, `stem_len` the length of its
 * stem (base without ".klnt"). */
static int stale_name(const char *name, const char *base, size_t stem_len, uint32_t nshards)
{
	if (!strcmp(name, base))
		return nshards > 1;
	uint32_t n;
	const char *ext;
	size_t sl = kiln_series_parse(name, NULL, &n, &ext);
	return sl == stem_len && !strncmp(name, base, stem_len) && !strcmp(ext, ".klnt") &&
	       (nshards == 1 || n != nshards);
}

/* Whether `path` names one of the model's files (the same inode): never to be written over. */
int kc_is_input(const kiln_model *m, const char *path)
{
	struct stat a;
	if (stat(path, &a) != 0)
		return 0;
	for (uint32_t i = 0; i < kiln_model_files(m); i++) {
		kiln_file_info fi;
		struct stat b;
		kiln_model_file_info(m, i, &fi);
		if (fi.path && !stat(fi.path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return 1;
	}
	return 0;
}

/*
 * After a successful write, remove what an earlier import to the same OUT left that this one did
 * not overwrite (docs/convert.md): a series of another count, or the single file when a series
 * was written now, or a series when one file was. Only regular files that open as valid KLNT
 * files are removed, never one of this import's sources; anything else of such a name is left.
 * Best effort: a file that cannot be removed stays. Returns how many were removed.
 */
static uint32_t remove_stale(const kiln_model *m, const char *out, uint32_t nshards,
			     uint32_t write_flags)
{
	const char *slash = strrchr(out, '/');
	const char *base = slash ? slash + 1 : out;
	size_t stem_len = strlen(base);
	if (stem_len > 5 && !strcmp(base + stem_len - 5, ".klnt"))
		stem_len -= 5;
	char *dir = slash ? strndup(out, (size_t)(slash - out) + (slash == out)) : strdup(".");
	DIR *d = dir ? opendir(dir) : NULL;
	if (!d) {
		free(dir);
		return 0;
	}
	uint32_t removed = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!stale_name(e->d_name, base, stem_len, nshards))
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		char *full = NULL;
		if (asprintf(&full, "%s/%s", dir, e->d_name) < 0)
			continue;
		if (kc_is_input(m, full)) {
			free(full);
			continue;
		}
		kiln_model *k;
		kiln_open_options one = {.flags = KILN_OPEN_ONE_FILE};
		if (!kiln_model_open(full, &one, &k, NULL)) {
			kiln_model_close(k);
			removed += !unlinkat(dirfd(d), e->d_name, 0);
		}
		free(full);
	}
	/* The removals are as durable as the files written (a crash may still bring one back). */
	if (removed && !(write_flags & KILN_WRITE_NO_SYNC))
		fsync(dirfd(d));
	closedir(d);
	free(dir);
	return removed;
}

int kc_klnt_write(const struct kc_list *l, const char *meta, size_t meta_len, const char *path,
		  uint64_t max_shard_size, struct kc_progress *p, kiln_convert_result *res,
		  kiln_error *err)
{
	if (res)
		memset(res, 0, sizeof(*res));
	const kiln_model *m = l->m;
	int rc = check_names(l, err);
	if (rc)
		return rc;
	if (l->n >= KILN_NONE32)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%" PRIu64 " tensors: more than KLNT holds", l->n);
	if (p && !p->total)
		p->total = l->bytes;
	/* The list position of each model tensor (KILN_NONE32: not written), for the links. */
	uint64_t all = kiln_model_count(m);
	uint32_t *pos = malloc((size_t)(all ? all : 1) * sizeof(*pos));
	if (!pos)
		return kc_nomem(err);
	for (uint64_t i = 0; i < all; i++)
		pos[i] = KILN_NONE32;
	for (uint64_t i = 0; i < l->n; i++)
		pos[l->t[i]->index] = (uint32_t)i;

	struct plan plan;
	kiln_error unsynced = {0};
	char **written = NULL, **finals = NULL; /* as written (staged) and where they go */
	uint32_t nwritten = 0, published = 0;
	if ((rc = plan_shards(l, pos, meta_len, max_shard_size, &plan, err)))
		goto out;
	if (!(written = calloc(plan.nshards, sizeof(char *))) ||
	    !(finals = calloc(plan.nshards, sizeof(char *)))) {
		rc = kc_nomem(err);
		goto out;
	}
	if (plan.nshards > 99999) {
		rc = kiln_error_set(err, KILN_LIMIT, 0, "%s: %" PRIu32 " shards, more than 99999",
				    path, plan.nshards);
		goto out;
	}
	/* Every shard is proven writable before the first is written. */
	for (uint32_t k = 0; k < plan.nshards && !rc; k++) {
		kiln_tensor_spec *specs;
		uint32_t n;
		struct feed f = {0};
		if ((rc = shard_specs(l, pos, &plan, k, meta, meta_len, &f, &specs, &n, err)))
			break;
		rc = kiln_write_size(specs, n, NULL, err);
		if (rc && err) {
			/* The writer's index is within the shard: name the tensor. */
			char msg[sizeof(err->message)];
			snprintf(msg, sizeof(msg), "%s", err->message);
			const char *name = err->tensor < n ? specs[err->tensor].name : NULL;
			if (name)
				kiln_error_set(err, rc, err->sys_errno, "tensor %.*s%s: %s",
					       SHORT(name, specs[err->tensor].name_len), msg);
		}
		free(specs);
	}
	for (uint32_t k = 0; k < plan.nshards && !rc; k++) {
		kiln_tensor_spec *specs;
		uint32_t n;
		struct feed f = {.l = l, .order = plan.order + plan.shards[k].first, .p = p};
		if ((rc = shard_specs(l, pos, &plan, k, meta, meta_len, &f, &specs, &n, err)))
			break;
		char *sp = shard_path(path, k, plan.nshards);
		if (sp && plan.nshards > 1 && kc_is_input(m, sp)) {
			rc = kiln_error_set(err, KILN_INVAL, 0,
					    "%s: shard %" PRIu32 " of the output would replace an "
					    "input file",
					    sp, k + 1);
			free(sp);
			free(specs);
			break;
		}
		/* One file is published by the writer's own rename; a series waits for all. */
		char *tp = sp && plan.nshards > 1 ? staging_path(sp) : NULL;
		if (!sp || (plan.nshards > 1 && !tp)) {
			free(sp);
			free(specs);
			rc = kc_nomem(err);
			break;
		}
		rc = kiln_write_file(tp ? tp : sp, specs, n, p ? p->write_flags : 0, err);
		free(specs);
		if (rc == KILN_UNSYNCED) {
			/* In place and complete, so the series goes on; the caller hears of it. */
			if (err)
				unsynced = *err;
			unsynced.code = KILN_UNSYNCED;
			rc = 0;
		}
		if (rc && f.failed && err) {
			int code = f.saved.code;
			*err = f.saved;
			rc = code;
		}
		if (rc) {
			free(sp);
			free(tp);
			break;
		}
		finals[nwritten] = sp;
		written[nwritten++] = tp ? tp : sp;
		if (res) {
			res->files++;
			res->tensors += plan.shards[k].n;
			for (uint32_t i = 0; i < plan.shards[k].n; i++)
				res->bytes +=
				    l->t[plan.order[plan.shards[k].first + i]]->byte_length;
		}
	}
	/* Publish the series: every shard is complete, so only a rename can fail now. */
	for (uint32_t i = 0; !rc && plan.nshards > 1 && i < nwritten; i++) {
		if (rename(written[i], finals[i]) != 0)
			rc = kiln_error_set(err, KILN_IO, errno,
					    "%s: cannot publish shard %" PRIu32 " of %" PRIu32
					    ": %s (%" PRIu32 " of them are in place)",
					    finals[i], i + 1, plan.nshards, strerror(errno), i);
		else
			published++;
	}
	if (!rc && plan.nshards > 1 && !(p && (p->write_flags & KILN_WRITE_NO_SYNC)) &&
	    sync_dir_of(finals[0]) != 0 && !unsynced.code) {
		kiln_error_set(
		    &unsynced, KILN_UNSYNCED, errno,
		    "%s: the series is in place but its directory could not be synced: %s",
		    finals[0], strerror(errno));
	}
	if (!rc && res && nwritten)
		snprintf(res->first, sizeof(res->first), "%s", finals[0]);
	if (!rc) {
		uint32_t removed = remove_stale(m, path, plan.nshards, p ? p->write_flags : 0);
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
	for (uint32_t i = 0; i < nwritten; i++) {
		if (rc && rc != KILN_UNSYNCED && (plan.nshards == 1 || i >= published))
			unlink(written[i]);
		if (written[i] != finals[i])
			free(finals[i]);
		free(written[i]);
	}
	free(written);
	free(finals);
	free(pos);
	plan_free(&plan);
	if (rc && rc != KILN_UNSYNCED && res)
		memset(res, 0, sizeof(*res));
	return rc;
}
