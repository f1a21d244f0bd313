/* SPDX-License-Identifier: MIT */
/*
 * safetensors in and out: single files, several shards, or a model.safetensors.index.json.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (an object: one
 * entry per tensor {"dtype", "shape", "data_offsets": [begin, end]} relative to the data region,
 * plus an optional "__metadata__" object of strings), then the data region. The rules follow the
 * reference implementation (huggingface/safetensors): N at most 100 MB; the tensors, sorted by
 * offset, tile the data region exactly (no gap, no overlap, nothing after the last one); each
 * tensor's bytes are its element count times its dtype's bits / 8, a whole number of bytes.
 * Unlike the reference we reject unknown fields in a tensor entry (they could not be kept) and
 * duplicate keys (json-c would keep the last one silently).
 *
 * JSON is parsed by json-c alone. json-c keeps the last of duplicate keys and cuts a key at an
 * escaped U+0000, so after it has accepted the text, one pass over it counts the members of
 * every object (a ':' outside a string) and notes keys holding \u0000: fewer members in the tree
 * than in the text means a duplicate key. That pass relies on json-c's verdict that the text is
 * valid JSON; it never interprets a value.
 *
 * docs/convert.md has the dtype table and the metadata rules.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"

#define ST_HEADER_CAP 100000000u /* the reference's MAX_HEADER_SIZE */
#define ST_JSON_DEPTH 32         /* a valid header nests 3 deep; index metadata may nest more */

/* ---------------------------------------------------------------------------------------------
 * dtypes
 * ------------------------------------------------------------------------------------------- */

/* safetensors dtype strings. Those with a KLNT dtype map to it; the others are opaque with code
 * 4096 + id (ids from 1024 up, clear of GGUF's 4096 + ggml type ids), layout = the string and
 * block size = the smallest whole number of bytes holding whole elements. The ids are pinned:
 * append, never renumber (docs/convert.md has the table). */
struct st_dtype {
	const char *name;
	uint16_t dtype; /* KLNT code */
	uint8_t bits;   /* per element */
	uint8_t block;  /* opaque only: bytes per storage unit */
};

static const struct st_dtype st_dtypes[] = {
    {"BOOL", KILN_DT_BOOL, 8, 0},
    {"U8", KILN_DT_U8, 8, 0},
    {"I8", KILN_DT_I8, 8, 0},
    {"U16", KILN_DT_U16, 16, 0},
    {"I16", KILN_DT_I16, 16, 0},
    {"U32", KILN_DT_U32, 32, 0},
    {"I32", KILN_DT_I32, 32, 0},
    {"U64", KILN_DT_U64, 64, 0},
    {"I64", KILN_DT_I64, 64, 0},
    {"F16", KILN_DT_F16, 16, 0},
    {"BF16", KILN_DT_BF16, 16, 0},
    {"F32", KILN_DT_F32, 32, 0},
    {"F64", KILN_DT_F64, 64, 0},
    {"F8_E4M3", KILN_DT_F8E4M3, 8, 0},
    {"F8_E5M2", KILN_DT_F8E5M2, 8, 0},
    {"F8_E8M0", KILN_DT_E8M0, 8, 0},
    /* Two per byte, element 2k in the low nibble: PyTorch's float4_e2m1fn_x2 packing, which is
     * KLNT's; the shape counts fp4 elements. The bytes are copied as they are. */
    {"F4", KILN_DT_E2M1, 4, 0},
    {"F6_E2M3", 4096 + 1024, 6, 3},
    {"F6_E3M2", 4096 + 1025, 6, 3},
    {"C64", 4096 + 1026, 64, 8},
    {"F8_E4M3FNUZ", 4096 + 1027, 8, 1},
    {"F8_E5M2FNUZ", 4096 + 1028, 8, 1},
};
#define ST_NDTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

static const struct st_dtype *dtype_by_name(const char *s, size_t len)
{
	for (size_t i = 0; i < ST_NDTYPES; i++)
		if (strlen(st_dtypes[i].name) == len && memcmp(st_dtypes[i].name, s, len) == 0)
			return &st_dtypes[i];
	return NULL;
}

/* The safetensors dtype of a model tensor, or NULL. */
static const struct st_dtype *dtype_of_tensor(const struct kc_tensor *t)
{
	for (size_t i = 0; i < ST_NDTYPES; i++) {
		const struct st_dtype *d = &st_dtypes[i];
		if (d->block == 0 && t->dtype == d->dtype)
			return d;
		if (d->block && kiln_dtype_is_opaque(t->dtype) && t->layout &&
		    strcmp(t->layout, d->name) == 0)
			return d;
	}
	return NULL;
}

/* Element count of a KLNT shape: 1 for rank 0, 0 with any zero dimension, else the product;
 * returns -1 when the product overflows. */
static int element_count(const uint64_t *shape, unsigned rank, uint64_t *count)
{
	uint64_t c = 1;
	for (unsigned k = 0; k < rank; k++)
		if (shape[k] == 0) {
			*count = 0;
			return 0;
		}
	for (unsigned k = 0; k < rank; k++)
		if (__builtin_mul_overflow(c, shape[k], &c))
			return -1;
	*count = c;
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * helpers
 * ------------------------------------------------------------------------------------------- */

/* A name as a message shows it: at most ~80 bytes cut at a character boundary, control
 * characters as '?', so the message stays one line. */
static const char *shown(const char *s, size_t len, char buf[96])
{
	size_t n = len, k = 0;
	int cut = 0;
	if (n > 80) {
		n = 80;
		while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
			n--;
		cut = 1;
	}
	for (size_t i = 0; i < n; i++)
		buf[k++] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	if (cut) {
		memcpy(buf + k, "...", 3);
		k += 3;
	}
	buf[k] = '\0';
	return buf;
}

static int nomem(kiln_error *err)
{
	return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
}

static int pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	for (size_t done = 0; done < len;) {
		ssize_t r = pread(fd, (uint8_t *)buf + done, len - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return -1;
		}
		done += (size_t)r;
	}
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * JSON: json-c parses; the member count finds what json-c folds away
 * ------------------------------------------------------------------------------------------- */

/* Parse len bytes of JSON text (already checked UTF-8) into *out; what = "header" or "index"
 * for messages. FRAME for text that is not JSON, LIMIT for nesting past ST_JSON_DEPTH. */
static int json_parse(const char *path, const char *what, const char *text, size_t len,
		      json_object **out, kiln_error *err)
{
	*out = NULL;
	json_tokener *tok = json_tokener_new_ex(ST_JSON_DEPTH);
	if (!tok)
		return nomem(err);
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
	json_object *o = json_tokener_parse_ex(tok, text, (int)len);
	enum json_tokener_error e = json_tokener_get_error(tok);
	size_t end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (o && e == json_tokener_success && end == len) {
		*out = o;
		return 0;
	}
	json_object_put(o);
	if (e == json_tokener_error_depth)
		return kiln_error_set(err, KILN_LIMIT, 0, "%s: %s JSON nests deeper than %d", path,
				      what, ST_JSON_DEPTH);
	if (e == json_tokener_success || e == json_tokener_continue)
		return kiln_error_set(err, KILN_FRAME, 0, "%s: %s is not JSON: %s", path, what,
				      e == json_tokener_continue ? "it ends early"
								 : "bytes after the value");
	return kiln_error_set(err, KILN_FRAME, 0, "%s: %s is not JSON: %s at byte %zu", path, what,
			      json_tokener_error_desc(e), end);
}

/* Members of every object in a json-c tree. Depth is bounded by the tokener's limit. */
static uint64_t tree_members(json_object *o)
{
	uint64_t n = 0;
	if (json_object_is_type(o, json_type_object)) {
		json_object_object_foreach(o, k, v)
		{
			(void)k;
			n += 1 + tree_members(v);
		}
	} else if (json_object_is_type(o, json_type_array)) {
		size_t len = json_object_array_length(o);
		for (size_t i = 0; i < len; i++)
			n += tree_members(json_object_array_get_idx(o, i));
	}
	return n;
}

/* The value of 4 hex digits (json-c has checked they are hex). */
static unsigned hex4(const char *p)
{
	unsigned v = 0;
	for (int k = 0; k < 4; k++) {
		char c = p[k];
		v = v << 4 | (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
	}
	return v;
}

/* One member of the outermost object, as the text has it. */
struct text_member {
	size_t key_off, key_len; /* the key's string token, quotes included */
	uint64_t inner;          /* members of the objects inside its value */
};

/*
 * Walk JSON text json-c has accepted: count the members of every object (*total), say whether a
 * key holds an escaped U+0000 (*nul_key), and, when `top` is not NULL, record each member of the
 * outermost object (up to max). json-c's strict mode still takes single-quoted strings, raw
 * control characters in strings, Infinity and lone surrogate escapes; *bad is the offset of the
 * first such byte (RFC 8259 has none of them), else SIZE_MAX. Returns the number of outermost
 * members.
 */
static size_t text_members(const char *s, size_t len, uint64_t *total, int *nul_key, size_t *bad,
			   struct text_member *top, size_t max)
{
	size_t depth = 0, ntop = 0, str_start = 0, str_end = 0;
	int in_str = 0, str_nul = 0, last_nul = 0;
	*total = 0;
	*nul_key = 0;
	*bad = SIZE_MAX;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (in_str) {
			if ((unsigned char)c < 0x20) {
				*bad = i;
				return ntop;
			}
			if (c == '\\' && i + 5 < len && s[i + 1] == 'u') {
				/* json-c checked the hex digits; it turns a lone surrogate into
				 * U+FFFD, which would rename a tensor silently */
				unsigned cp = hex4(s + i + 2);
				if (cp == 0)
					str_nul = 1;
				if (cp >= 0xDC00 && cp <= 0xDFFF) {
					*bad = i;
					return ntop;
				}
				if (cp >= 0xD800 && cp <= 0xDBFF) {
					unsigned lo =
					    i + 11 < len && s[i + 6] == '\\' && s[i + 7] == 'u'
						? hex4(s + i + 8)
						: 0;
					if (lo < 0xDC00 || lo > 0xDFFF) {
						*bad = i;
						return ntop;
					}
					i += 6;
				}
				i += 5;
			} else if (c == '\\') {
				i++; /* the escaped character */
			} else if (c == '"') {
				in_str = 0;
				str_end = i + 1;
				last_nul = str_nul;
			}
			continue;
		}
		switch (c) {
		case '"':
			in_str = 1;
			str_nul = 0;
			str_start = i;
			break;
		case '{':
		case '[':
			depth++;
			break;
		case '}':
		case ']':
			depth--;
			break;
		case ':':
			++*total;
			if (last_nul)
				*nul_key = 1;
			if (depth == 1) {
				if (top && ntop < max)
					top[ntop] =
					    (struct text_member){str_start, str_end - str_start, 0};
				ntop++;
			} else if (top && ntop > 0 && ntop <= max) {
				top[ntop - 1].inner++;
			}
			break;
		default:
			/* numbers, true, false, null, whitespace, commas: nothing else */
			if (!strchr(" \t\n\r,0123456789+-.eEtruefalsn", c) || c == '\0') {
				*bad = i;
				return ntop;
			}
			break;
		}
	}
	return ntop;
}

/* Decode a key token (quotes included) with json-c. */
static json_object *decode_key(const char *s, size_t len)
{
	json_tokener *tok = json_tokener_new_ex(1);
	if (!tok)
		return NULL;
	json_object *o = json_tokener_parse_ex(tok, s, (int)len);
	json_tokener_free(tok);
	return o;
}

static int cmp_keys(const void *a, const void *b)
{
	json_object *x = *(json_object *const *)a, *y = *(json_object *const *)b;
	int lx = json_object_get_string_len(x), ly = json_object_get_string_len(y);
	int c = memcmp(json_object_get_string(x), json_object_get_string(y),
		       (size_t)(lx < ly ? lx : ly));
	return c ? c : (lx > ly) - (lx < ly);
}

/*
 * The text holds keys the tree lost: name the first duplicate. what = "tensor name" for a
 * header, "key" elsewhere. Called only on the way to a rejection; returns TYPE (or NOMEM).
 */
static int name_duplicate(const char *path, const char *what, const char *text, size_t len,
			  json_object *root, kiln_error *err)
{
	uint64_t total;
	int nul;
	size_t bad;
	size_t n = text_members(text, len, &total, &nul, &bad, NULL, 0);
	struct text_member *top = calloc(n ? n : 1, sizeof(*top));
	json_object **keys = calloc(n ? n : 1, sizeof(*keys));
	char buf[96];
	int rc = -1;
	if (!top || !keys) {
		rc = nomem(err);
		goto out;
	}
	text_members(text, len, &total, &nul, &bad, top, n);
	for (size_t i = 0; i < n; i++)
		if (!(keys[i] = decode_key(text + top[i].key_off, top[i].key_len))) {
			rc = nomem(err);
			goto out;
		}
	if ((size_t)json_object_object_length(root) != n) {
		json_object **sorted = malloc(n * sizeof(*sorted));
		if (!sorted) {
			rc = nomem(err);
			goto out;
		}
		memcpy(sorted, keys, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), cmp_keys);
		for (size_t i = 1; i < n && rc < 0; i++)
			if (cmp_keys(&sorted[i - 1], &sorted[i]) == 0)
				rc = kiln_error_set(
				    err, KILN_TYPE, 0, "%s: duplicate %s %s", path, what,
				    shown(json_object_get_string(sorted[i]),
					  (size_t)json_object_get_string_len(sorted[i]), buf));
		free(sorted);
	}
	/* Inside a member's value: compare the text's count with the tree's. */
	for (size_t i = 0; i < n && rc < 0; i++) {
		json_object *v = json_object_object_get(root, json_object_get_string(keys[i]));
		if (tree_members(v) != top[i].inner)
			rc = kiln_error_set(
			    err, KILN_TYPE, 0, "%s: duplicate key inside the value of %s", path,
			    shown(json_object_get_string(keys[i]),
				  (size_t)json_object_get_string_len(keys[i]), buf));
	}
	if (rc < 0)
		rc = kiln_error_set(err, KILN_TYPE, 0, "%s: duplicate key", path);
out:
	for (size_t i = 0; keys && i < n; i++)
		json_object_put(keys[i]);
	free(keys);
	free(top);
	return rc;
}

/* After json-c accepted `text` into `root`: reject what its strict mode lets through beyond
 * RFC 8259, and what it folded away (duplicate keys, keys cut at U+0000). */
static int json_check_text(const char *path, const char *what, const char *text, size_t len,
			   json_object *root, kiln_error *err)
{
	uint64_t total;
	int nul;
	size_t bad;
	text_members(text, len, &total, &nul, &bad, NULL, 0);
	if (bad != SIZE_MAX)
		return kiln_error_set(err, KILN_FRAME, 0,
				      "%s: not standard JSON: unexpected character at byte %zu",
				      path, bad);
	if (nul)
		return kiln_error_set(err, KILN_TYPE, 0, "%s: a key holds U+0000 (not supported)",
				      path);
	if (tree_members(root) != total)
		return name_duplicate(path, what, text, len, root, err);
	return 0;
}

/* Read a whole small file (an index) into a NUL-terminated buffer, at most cap bytes. */
static int read_small(const char *path, size_t cap, char **out, size_t *len, kiln_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return kiln_error_set(err, KILN_IO, e, "%s: cannot open: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return kiln_error_set(err, KILN_IO, EINVAL, "%s: not a regular file", path);
	}
	if ((uint64_t)st.st_size > cap) {
		close(fd);
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: %" PRIu64 " bytes, above the %zu cap", path,
				      (uint64_t)st.st_size, cap);
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return nomem(err);
	}
	if (pread_all(fd, buf, (size_t)st.st_size, 0) != 0) {
		int e = errno;
		free(buf);
		close(fd);
		return kiln_error_set(err, KILN_IO, e, "%s: read failed: %s", path, strerror(e));
	}
	close(fd);
	buf[st.st_size] = '\0';
	*out = buf;
	*len = (size_t)st.st_size;
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------------- */

/* A tensor entry of one file, checked, before it joins the model. */
struct entry {
	const char *name; /* json-c's key (no U+0000: those are rejected) */
	size_t name_len;
	const struct st_dtype *dt;
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK];
	uint64_t begin, end;
	size_t order; /* header position, the tie-break between empty tensors at one offset */
};

static int by_offset(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

/* A non-negative JSON integer below 2^64 - 1 (json-c saturates larger ones to 2^64 - 1, so that
 * value itself cannot be told from an overflow and is refused). */
static int get_u64(json_object *v, uint64_t *out, const char **why)
{
	if (!json_object_is_type(v, json_type_int)) {
		*why = "is not an integer";
		return KILN_TYPE;
	}
	if (json_object_get_int64(v) < 0) {
		*why = "is negative";
		return KILN_TYPE;
	}
	*out = json_object_get_uint64(v);
	if (*out == UINT64_MAX) {
		*why = "does not fit in 64 bits";
		return KILN_LIMIT;
	}
	return 0;
}

/* Check one tensor entry (everything but its place among the others). */
static int check_entry(const char *path, struct entry *e, json_object *v, uint64_t data_size,
		       kiln_error *err)
{
	char nb[96];
	const char *nm = shown(e->name, e->name_len, nb);
	if (!json_object_is_type(v, json_type_object))
		return kiln_error_set(err, KILN_TYPE, 0,
				      "%s: tensor %s: the entry is not an object", path, nm);
	json_object *dtype = NULL, *shape = NULL, *offs = NULL;
	json_object_object_foreach(v, key, val)
	{
		if (strcmp(key, "dtype") == 0)
			dtype = val;
		else if (strcmp(key, "shape") == 0)
			shape = val;
		else if (strcmp(key, "data_offsets") == 0)
			offs = val;
		else
			return kiln_error_set(err, KILN_TYPE, 0, "%s: tensor %s: unknown field %s",
					      path, nm, shown(key, strlen(key), (char[96]){0}));
	}
	if (!dtype || !shape || !offs)
		return kiln_error_set(err, KILN_TYPE, 0, "%s: tensor %s: no %s field", path, nm,
				      !dtype   ? "dtype"
				      : !shape ? "shape"
					       : "data_offsets");
	if (!json_object_is_type(dtype, json_type_string))
		return kiln_error_set(err, KILN_TYPE, 0, "%s: tensor %s: dtype is not a string",
				      path, nm);
	e->dt =
	    dtype_by_name(json_object_get_string(dtype), (size_t)json_object_get_string_len(dtype));
	if (!e->dt)
		return kiln_error_set(
		    err, KILN_TYPE, 0, "%s: tensor %s: unknown dtype %s", path, nm,
		    shown(json_object_get_string(dtype), (size_t)json_object_get_string_len(dtype),
			  (char[96]){0}));
	if (!json_object_is_type(shape, json_type_array))
		return kiln_error_set(err, KILN_TYPE, 0, "%s: tensor %s: shape is not an array",
				      path, nm);
	size_t rank = json_object_array_length(shape);
	if (rank > KILN_MAX_RANK)
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: tensor %s: rank %zu, more than KLNT's %d", path, nm,
				      rank, KILN_MAX_RANK);
	e->rank = (uint8_t)rank;
	const char *why;
	int rc;
	for (size_t k = 0; k < rank; k++)
		if ((rc = get_u64(json_object_array_get_idx(shape, k), &e->shape[k], &why)))
			return kiln_error_set(err, rc, 0, "%s: tensor %s: shape[%zu] %s", path, nm,
					      k, why);
	if (!json_object_is_type(offs, json_type_array) || json_object_array_length(offs) != 2)
		return kiln_error_set(err, KILN_TYPE, 0,
				      "%s: tensor %s: data_offsets is not [begin, end]", path, nm);
	if ((rc = get_u64(json_object_array_get_idx(offs, 0), &e->begin, &why)) ||
	    (rc = get_u64(json_object_array_get_idx(offs, 1), &e->end, &why)))
		return kiln_error_set(err, rc, 0, "%s: tensor %s: a data offset %s", path, nm, why);
	if (e->begin > e->end)
		return kiln_error_set(err, KILN_TYPE, 0,
				      "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
				      "] are reversed",
				      path, nm, e->begin, e->end);
	if (e->end > data_size)
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: tensor %s: data_offsets end %" PRIu64
				      " past the %" PRIu64 "-byte data region",
				      path, nm, e->end, data_size);
	uint64_t count, bits;
	if (element_count(e->shape, e->rank, &count) != 0 ||
	    __builtin_mul_overflow(count, (uint64_t)e->dt->bits, &bits))
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: tensor %s: the shape's byte size overflows 64 bits",
				      path, nm);
	if (bits % 8)
		return kiln_error_set(err, KILN_TYPE, 0,
				      "%s: tensor %s: %" PRIu64 " %s elements are not whole bytes",
				      path, nm, count, e->dt->name);
	if (e->end - e->begin != bits / 8)
		return kiln_error_set(err, KILN_TYPE, 0,
				      "%s: tensor %s: %" PRIu64
				      " bytes, but shape and %s need %" PRIu64,
				      path, nm, e->end - e->begin, e->dt->name, bits / 8);
	return 0;
}

/* __metadata__: an object of strings. */
static int check_metadata(const char *path, json_object *v, kiln_error *err)
{
	if (!json_object_is_type(v, json_type_object))
		return kiln_error_set(err, KILN_TYPE, 0, "%s: __metadata__ is not an object", path);
	json_object_object_foreach(v, key, val)
	{
		if (!json_object_is_type(val, json_type_string))
			return kiln_error_set(err, KILN_TYPE, 0,
					      "%s: __metadata__ key %s: the value is not a string",
					      path, shown(key, strlen(key), (char[96]){0}));
	}
	return 0;
}

/* The shared state of one kc_st_read call. */
struct reader {
	struct kc_model *m;
	json_object *names;      /* set of every tensor name so far (across files) */
	json_object *first_meta; /* the first file's __metadata__ (or NULL) */
	json_object *shard_meta; /* files whose __metadata__ differs from the first's */
	uint32_t files;
	json_object *weight_map; /* the index's, or NULL */
	const char *index_path;
	const char *shard_name; /* the index's name of the file being read */
};

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* Read one safetensors file into the model. */
static int read_file(struct reader *r, const char *path, const char *for_tensor, kiln_error *err)
{
	struct kc_model *m = r->m;
	char nb[96];
	int src = kc_model_add_source(m, path, err);
	if (src < 0) {
		if (!err)
			return KILN_IO;
		if (for_tensor) /* a shard the index names: say which tensor wanted it */
			kiln_error_set(err, err->code, err->sys_errno,
				       "%s: shard %s (holding tensor %s) cannot be opened: %s",
				       r->index_path, r->shard_name, for_tensor,
				       strerror(err->sys_errno));
		return err->code;
	}
	const struct kc_source *s = &m->srcs[src];
	uint8_t len8[8];
	if (s->size < 8)
		return kiln_error_set(err, KILN_FRAME, 0,
				      "%s: %" PRIu64 " bytes, too short for a safetensors file",
				      path, s->size);
	if (pread_all(s->fd, len8, 8, 0) != 0)
		return kiln_error_set(err, KILN_IO, errno, "%s: read failed: %s", path,
				      strerror(errno));
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | len8[i];
	if (n > ST_HEADER_CAP)
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: header length %" PRIu64 " above the %u-byte cap", path,
				      n, ST_HEADER_CAP);
	if (n > s->size - 8)
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "%s: header length %" PRIu64
				      " past the end of the file (%" PRIu64 " bytes)",
				      path, n, s->size);
	uint64_t data_base = 8 + n, data_size = s->size - data_base;
	char *text = malloc((size_t)n + 1);
	if (!text)
		return nomem(err);
	int rc = 0;
	json_object *root = NULL;
	struct entry *ents = NULL;
	if (pread_all(s->fd, text, (size_t)n, 8) != 0) {
		rc = kiln_error_set(err, KILN_IO, errno, "%s: read failed: %s", path,
				    strerror(errno));
		goto out;
	}
	text[n] = '\0';
	size_t bad = kiln_utf8_check(text, (size_t)n);
	bad = bad == SIZE_MAX ? (size_t)n : bad;
	if (bad != n) {
		rc = kiln_error_set(err, KILN_UTF8, 0,
				    "%s: header byte %zu (file offset %zu) is not UTF-8", path, bad,
				    bad + 8);
		goto out;
	}
	if ((rc = json_parse(path, "header", text, (size_t)n, &root, err)))
		goto out;
	if (!json_object_is_type(root, json_type_object)) {
		rc = kiln_error_set(err, KILN_FRAME, 0, "%s: header is not a JSON object", path);
		goto out;
	}
	if ((rc = json_check_text(path, "tensor name", text, (size_t)n, root, err)))
		goto out;

	size_t cap = (size_t)json_object_object_length(root), ne = 0;
	ents = calloc(cap ? cap : 1, sizeof(*ents));
	if (!ents) {
		rc = nomem(err);
		goto out;
	}
	json_object *meta = NULL;
	size_t order = 0;
	json_object_object_foreach(root, key, v)
	{
		if (strcmp(key, "__metadata__") == 0) {
			if ((rc = check_metadata(path, v, err)))
				goto out;
			meta = v;
		} else {
			struct entry *e = &ents[ne];
			*e = (struct entry){.name = key, .name_len = strlen(key), .order = order};
			if ((rc = check_entry(path, e, v, data_size, err)))
				goto out;
			ne++;
		}
		order++;
	}

	/* The reference's tiling rule: sorted by offset, each tensor starts where the previous
	 * ended, the first at 0 and the last ends at the end of the file. */
	qsort(ents, ne, sizeof(*ents), by_offset);
	uint64_t at = 0;
	for (size_t i = 0; i < ne; i++) {
		struct entry *e = &ents[i];
		if (e->begin != at) {
			char pb[96];
			if (e->begin > at)
				rc = kiln_error_set(err, KILN_TYPE, 0,
						    "%s: tensor %s: data bytes %" PRIu64
						    "..%" PRIu64 " before it belong to no tensor",
						    path, shown(e->name, e->name_len, nb), at,
						    e->begin);
			else
				rc = kiln_error_set(
				    err, KILN_TYPE, 0, "%s: tensor %s overlaps tensor %s", path,
				    shown(e->name, e->name_len, nb),
				    shown(ents[i - 1].name, ents[i - 1].name_len, pb));
			goto out;
		}
		at = e->end;
	}
	if (at != data_size) {
		rc = kiln_error_set(err, KILN_TYPE, 0,
				    "%s: %" PRIu64
				    " data bytes after the last tensor belong to none",
				    path, data_size - at);
		goto out;
	}

	/* Names unique across files; under an index, each in the file the index says. */
	for (size_t i = 0; i < ne; i++) {
		struct entry *e = &ents[i];
		if (json_object_object_get_ex(r->names, e->name, NULL)) {
			rc = kiln_error_set(err, KILN_TYPE, 0,
					    "%s: tensor %s is also in an earlier file", path,
					    shown(e->name, e->name_len, nb));
			goto out;
		}
		if (r->weight_map) {
			json_object *f;
			if (!json_object_object_get_ex(r->weight_map, e->name, &f)) {
				rc = kiln_error_set(
				    err, KILN_TYPE, 0,
				    "%s: tensor %s of shard %s is not in the weight_map",
				    r->index_path, shown(e->name, e->name_len, nb), r->shard_name);
				goto out;
			}
			if (strcmp(json_object_get_string(f), r->shard_name) != 0) {
				rc = kiln_error_set(
				    err, KILN_TYPE, 0,
				    "%s: tensor %s is in shard %s, but the weight_map says %s",
				    r->index_path, shown(e->name, e->name_len, nb), r->shard_name,
				    json_object_get_string(f));
				goto out;
			}
		}
		if (json_object_object_add(r->names, e->name, NULL) != 0) {
			rc = nomem(err);
			goto out;
		}
		struct kc_tensor *t = kc_model_add_tensor(m, e->name, e->name_len, err);
		if (!t) {
			rc = err ? err->code : KILN_NOMEM;
			goto out;
		}
		uint64_t count;
		element_count(e->shape, e->rank, &count);
		t->dtype = e->dt->dtype;
		t->rank = e->rank;
		memcpy(t->shape, e->shape, sizeof(t->shape));
		t->byte_length = e->end - e->begin;
		t->src = (uint32_t)src;
		t->src_off = data_base + e->begin;
		if (e->dt->block) {
			t->block_size = e->dt->block;
			if (!(t->layout = strdup(e->dt->name))) {
				rc = nomem(err);
				goto out;
			}
		}
	}

	/* Metadata: the first file's; a later file's only where it differs. */
	if (r->files == 0) {
		r->first_meta = meta ? json_object_get(meta) : NULL;
	} else if (!(meta && r->first_meta ? json_object_equal(meta, r->first_meta)
					   : !meta && !r->first_meta)) {
		if (!r->shard_meta && !(r->shard_meta = json_object_new_object())) {
			rc = nomem(err);
			goto out;
		}
		json_object_object_add(r->shard_meta, base_name(path),
				       meta ? json_object_get(meta) : NULL);
	}
	r->files++;
out:
	free(ents);
	json_object_put(root);
	free(text);
	return rc;
}

/* A weight_map file name: relative, no "..", no empty name. */
static int safe_relative(const char *p)
{
	if (!*p || *p == '/')
		return 0;
	for (const char *c = p; *c;) {
		const char *e = strchr(c, '/');
		size_t len = e ? (size_t)(e - c) : strlen(c);
		if (len == 2 && c[0] == '.' && c[1] == '.')
			return 0;
		if (!e)
			break;
		c = e + 1;
	}
	return 1;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* model.safetensors.index.json: {"metadata": ..., "weight_map": {tensor: file}}. */
static int read_index(struct reader *r, const char *path, json_object **index_meta, kiln_error *err)
{
	char *text = NULL, *full = NULL;
	const char **files = NULL;
	size_t len = 0;
	json_object *root = NULL;
	char nb[96];
	int rc = read_small(path, ST_HEADER_CAP, &text, &len, err);
	if (rc)
		return rc;
	size_t bad = kiln_utf8_check(text, len);
	bad = bad == SIZE_MAX ? len : bad;
	if (bad != len) {
		rc = kiln_error_set(err, KILN_UTF8, 0, "%s: byte %zu is not UTF-8", path, bad);
		goto out;
	}
	if ((rc = json_parse(path, "index", text, len, &root, err)))
		goto out;
	if (!json_object_is_type(root, json_type_object)) {
		rc = kiln_error_set(err, KILN_FRAME, 0, "%s: the index is not a JSON object", path);
		goto out;
	}
	if ((rc = json_check_text(path, "key", text, len, root, err)))
		goto out;
	json_object *wm = NULL;
	json_object_object_foreach(root, key, val)
	{
		if (strcmp(key, "weight_map") == 0) {
			wm = val;
		} else if (strcmp(key, "metadata") == 0) {
			*index_meta = json_object_get(val);
		} else {
			rc = kiln_error_set(err, KILN_TYPE, 0, "%s: unknown index key %s", path,
					    shown(key, strlen(key), nb));
			goto out;
		}
	}
	if (!wm || !json_object_is_type(wm, json_type_object)) {
		rc = kiln_error_set(err, KILN_TYPE, 0, "%s: no weight_map object", path);
		goto out;
	}
	size_t nt = (size_t)json_object_object_length(wm), nf = 0;
	files = calloc(nt ? nt : 1, sizeof(*files));
	if (!files) {
		rc = nomem(err);
		goto out;
	}
	json_object_object_foreach(wm, tname, fobj)
	{
		if (!json_object_is_type(fobj, json_type_string) ||
		    strlen(json_object_get_string(fobj)) !=
			(size_t)json_object_get_string_len(fobj) ||
		    !safe_relative(json_object_get_string(fobj))) {
			rc = kiln_error_set(
			    err, KILN_TYPE, 0,
			    "%s: tensor %s: the shard must be a relative path without \"..\"", path,
			    shown(tname, strlen(tname), nb));
			goto out;
		}
		files[nf++] = json_object_get_string(fobj);
	}
	/* Each shard once, in name order (model-00001-of-... first). */
	qsort(files, nf, sizeof(*files), cmp_str);
	const char *slash = strrchr(path, '/');
	size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	r->weight_map = wm;
	r->index_path = path;
	for (size_t i = 0; i < nf; i++) {
		if (i > 0 && strcmp(files[i], files[i - 1]) == 0)
			continue;
		free(full);
		if (!(full = malloc(dirlen + strlen(files[i]) + 1))) {
			rc = nomem(err);
			goto out;
		}
		memcpy(full, path, dirlen);
		strcpy(full + dirlen, files[i]);
		const char *for_tensor = NULL;
		json_object_object_foreach(wm, tn, fo)
		{
			if (strcmp(json_object_get_string(fo), files[i]) == 0) {
				for_tensor = shown(tn, strlen(tn), nb);
				break;
			}
		}
		r->shard_name = files[i];
		if ((rc = read_file(r, full, for_tensor, err)))
			goto out;
	}
	/* Every weight_map entry was found in its file. */
	json_object_object_foreach(wm, tn2, fo2)
	{
		if (!json_object_object_get_ex(r->names, tn2, NULL)) {
			rc = kiln_error_set(
			    err, KILN_TYPE, 0, "%s: tensor %s: shard %s does not hold it", path,
			    shown(tn2, strlen(tn2), nb), json_object_get_string(fo2));
			goto out;
		}
	}
out:
	r->weight_map = NULL;
	free(full);
	free(files);
	json_object_put(root);
	free(text);
	return rc;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

int kc_st_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err)
{
	if (!m || !paths || n == 0)
		return kiln_error_set(err, KILN_INVAL, EINVAL, "no safetensors source");
	struct reader r = {.m = m, .names = json_object_new_object()};
	json_object *index_meta = NULL;
	int rc = 0;
	if (!r.names)
		return nomem(err);
	for (uint32_t i = 0; i < n && !rc; i++) {
		if (ends_with(paths[i], ".json")) {
			if (n != 1) {
				rc = kiln_error_set(err, KILN_INVAL, EINVAL,
						    "%s: an index must be the only source",
						    paths[i]);
				break;
			}
			rc = read_index(&r, paths[i], &index_meta, err);
		} else {
			rc = read_file(&r, paths[i], NULL, err);
		}
	}
	if (!rc) {
		json_object *st = json_object_new_object();
		if (!st) {
			rc = nomem(err);
		} else {
			if (r.first_meta)
				json_object_object_add(st, "metadata",
						       json_object_get(r.first_meta));
			if (r.shard_meta)
				json_object_object_add(st, "shard_metadata",
						       json_object_get(r.shard_meta));
			if (index_meta)
				json_object_object_add(st, "index_metadata",
						       json_object_get(index_meta));
			json_object_object_add(m->meta, "source",
					       json_object_new_string("safetensors"));
			json_object_object_add(m->meta, "safetensors", st);
		}
	}
	json_object_put(index_meta);
	json_object_put(r.first_meta);
	json_object_put(r.shard_meta);
	json_object_put(r.names);
	return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

struct writer {
	const struct kc_model *m;
	const char *header; /* JSON text */
	size_t header_len, padded;
	struct kc_progress *p;
};

static int write_all(int fd, const void *buf, size_t len, kiln_error *err)
{
	for (size_t w = 0; w < len;) {
		ssize_t k = write(fd, (const uint8_t *)buf + w, len - w);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return kiln_error_set(err, KILN_IO, errno, "write failed: %s",
					      strerror(errno));
		w += (size_t)k;
	}
	return 0;
}

static int fill(void *ctx, int fd, kiln_error *err)
{
	struct writer *w = ctx;
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)w->padded >> (8 * i));
	int rc = write_all(fd, len8, 8, err);
	if (!rc)
		rc = write_all(fd, w->header, w->header_len, err);
	if (!rc && w->padded > w->header_len)
		rc = write_all(fd, "        ", w->padded - w->header_len, err);
	if (rc)
		return rc;
	void *buf = kc_copy_buffer();
	if (!buf)
		return nomem(err);
	for (uint32_t i = 0; i < w->m->n && !rc; i++)
		rc = kc_copy_payload(w->m, &w->m->tensors[i], fd, buf, w->p, err);
	free(buf);
	return rc;
}

/* The header entry of tensor t, or INVAL naming it and why. */
static int header_entry(const struct kc_tensor *t, uint64_t begin, json_object **out,
			kiln_error *err)
{
	char nb[96];
	const char *nm = shown(t->name, t->name_len, nb);
	*out = NULL;
	if (strlen(t->name) != t->name_len)
		return kiln_error_set(err, KILN_INVAL, EINVAL,
				      "tensor %s: a name holding U+0000 is not supported", nm);
	const struct st_dtype *d = dtype_of_tensor(t);
	if (!d) {
		if (kiln_dtype_is_opaque(t->dtype))
			return kiln_error_set(err, KILN_INVAL, EINVAL,
					      "tensor %s: layout %s has no safetensors dtype", nm,
					      t->layout ? t->layout : "(none)");
		return kiln_error_set(
		    err, KILN_INVAL, EINVAL, "tensor %s: dtype %s has no safetensors dtype", nm,
		    kiln_dtype_name(t->dtype) ? kiln_dtype_name(t->dtype) : "(unknown)");
	}
	uint64_t count, bits;
	if (t->rank > KILN_MAX_RANK || element_count(t->shape, t->rank, &count) != 0 ||
	    __builtin_mul_overflow(count, (uint64_t)d->bits, &bits))
		return kiln_error_set(err, KILN_INVAL, EINVAL, "tensor %s: the shape overflows",
				      nm);
	if (bits % 8)
		return kiln_error_set(err, KILN_INVAL, EINVAL,
				      "tensor %s: %" PRIu64 " %s elements are not whole bytes, "
				      "which safetensors cannot store",
				      nm, count, d->name);
	if (bits / 8 != t->byte_length)
		return kiln_error_set(err, KILN_INVAL, EINVAL,
				      "tensor %s: %" PRIu64
				      " bytes, but shape and %s need %" PRIu64,
				      nm, t->byte_length, d->name, bits / 8);
	json_object *e = json_object_new_object(), *shape = json_object_new_array(),
		    *offs = json_object_new_array();
	if (!e || !shape || !offs) {
		json_object_put(e);
		json_object_put(shape);
		json_object_put(offs);
		return nomem(err);
	}
	for (unsigned k = 0; k < t->rank; k++)
		json_object_array_add(shape, json_object_new_uint64(t->shape[k]));
	json_object_array_add(offs, json_object_new_uint64(begin));
	json_object_array_add(offs, json_object_new_uint64(begin + t->byte_length));
	json_object_object_add(e, "dtype", json_object_new_string(d->name));
	json_object_object_add(e, "shape", shape);
	json_object_object_add(e, "data_offsets", offs);
	*out = e;
	return 0;
}

int kc_st_write(const struct kc_model *m, const char *path, struct kc_progress *p, kiln_error *err)
{
	if (!m || !path)
		return kiln_error_set(err, KILN_INVAL, EINVAL, "no model or no path");
	json_object *root = json_object_new_object();
	if (!root)
		return nomem(err);
	int rc = 0;
	char nb[96];

	/* __metadata__ from the kept document, when there is one. */
	json_object *st, *meta;
	if (json_object_object_get_ex(m->meta, "safetensors", &st) &&
	    json_object_object_get_ex(st, "metadata", &meta) && meta) {
		if (!json_object_is_type(meta, json_type_object)) {
			rc = kiln_error_set(err, KILN_INVAL, EINVAL,
					    "%s: safetensors.metadata is not an object", path);
			goto out;
		}
		json_object_object_foreach(meta, key, val)
		{
			if (!json_object_is_type(val, json_type_string)) {
				rc = kiln_error_set(
				    err, KILN_INVAL, EINVAL,
				    "%s: safetensors.metadata key %s is not a string", path,
				    shown(key, strlen(key), nb));
				goto out;
			}
		}
		json_object_object_add(root, "__metadata__", json_object_get(meta));
	}

	uint64_t at = 0;
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		json_object *e;
		if ((rc = header_entry(t, at, &e, err))) {
			if (rc == KILN_INVAL && err) {
				char what[sizeof(err->message)];
				memcpy(what, err->message, sizeof(what));
				kiln_error_set(err, rc, EINVAL, "%s: %s", path, what);
			}
			goto out;
		}
		if (strcmp(t->name, "__metadata__") == 0 ||
		    json_object_object_get_ex(root, t->name, NULL)) {
			json_object_put(e);
			rc = kiln_error_set(err, KILN_INVAL, EINVAL, "%s: tensor %s: %s", path,
					    shown(t->name, t->name_len, nb),
					    strcmp(t->name, "__metadata__") == 0
						? "the name is reserved"
						: "the name is used twice");
			goto out;
		}
		json_object_object_add(root, t->name, e);
		at += t->byte_length;
	}

	size_t len;
	const char *text = json_object_to_json_string_length(
	    root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	if (!text) {
		rc = nomem(err);
		goto out;
	}
	size_t padded = (len + 7) & ~(size_t)7;
	if (padded > ST_HEADER_CAP) {
		rc = kiln_error_set(err, KILN_INVAL, EINVAL,
				    "%s: the header would be %zu bytes, above the %u-byte cap",
				    path, padded, ST_HEADER_CAP);
		goto out;
	}
	if (p && p->total == 0)
		p->total = at;
	struct writer w = {.m = m, .header = text, .header_len = len, .padded = padded, .p = p};
	rc = kc_write_atomic(path, fill, &w, p, err);
out:
	json_object_put(root);
	return rc;
}
