/* SPDX-License-Identifier: MIT */
/*
 * Metadata on the way out (docs/convert.md): the kiln.metadata document a KLNT output keeps, the
 * key/values a GGUF output writes, and the __metadata__ of a safetensors output. All three come
 * from the model's typed metadata (kiln_model_metadata), through one list of key/values with
 * their GGUF type and value in the document's JSON convention:
 *   {"type": "u32", "value": 256}, {"type": "arr", "value": {"type": "str", "items": [...]}}
 * Integers are JSON integers (json-c keeps all of u64 and i64), a finite float the shortest
 * decimal that reads back to its bits, a NaN or infinity "bits:0x" and its bit pattern, a string
 * that is not UTF-8 {"bytes": hex}. A safetensors export keeps GGUF key/values as one
 * __metadata__ entry each (the key, its {"type", "value"} as JSON text) beside "kiln.gguf":
 * {"version", "alignment"}, which is how an export of that file back to GGUF (or an import)
 * knows to read them back as typed values, byte for byte.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_int.h"

#define MARKER     "kiln.gguf"
#define MAX_DEPTH  16 /* GGUF arrays of arrays, as the reader allows */
#define JSON_DEPTH 512

static const char *const type_names[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
					 "bool", "str", "arr", "u64", "i64", "f64"};
#define NTYPES 13

static int type_named(const char *s)
{
	for (int i = 0; s && i < NTYPES; i++)
		if (!strcmp(type_names[i], s))
			return i;
	return -1;
}

/* --- typed values to the JSON convention ----------------------------------------------------- */

/* The shortest decimal that reads back to exactly d, always with a '.' or an exponent so
 * json-c keeps it a double (a bare "-0" would read back as the integer 0). */
static json_object *json_double_exact(double d)
{
	char s[40];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(s, sizeof(s), "%.*g", prec, d);
		if (strtod(s, NULL) == d && signbit(strtod(s, NULL)) == signbit(d))
			break;
	}
	if (!strpbrk(s, ".e"))
		strcat(s, ".0");
	return json_object_new_double_s(d, s);
}

static json_object *json_float(double v, int is32)
{
	uint64_t bits;
	if (is32) {
		float f = (float)v;
		uint32_t b;
		memcpy(&b, &f, 4);
		bits = b;
	} else {
		memcpy(&bits, &v, 8);
	}
	if (isfinite(v))
		return json_double_exact(v);
	char s[32];
	snprintf(s, sizeof(s), "bits:0x%0*" PRIx64, is32 ? 8 : 16, bits);
	return json_object_new_string(s);
}

static json_object *json_string_or_bytes(const char *s, size_t n)
{
	if (kiln_utf8_check(s, n) == SIZE_MAX)
		return json_object_new_string_len(s, (int)n);
	static const char hex[] = "0123456789abcdef";
	char *h = malloc(2 * n + 1);
	if (!h)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		h[2 * i] = hex[(uint8_t)s[i] >> 4];
		h[2 * i + 1] = hex[(uint8_t)s[i] & 15];
	}
	json_object *o = json_object_new_object(), *b = json_object_new_string_len(h, (int)(2 * n));
	free(h);
	if (!o || !b || json_object_object_add(o, "bytes", b)) {
		json_object_put(o);
		json_object_put(b);
		return NULL;
	}
	return o;
}

/* A value as the convention writes V for its type. */
static json_object *json_value(const kiln_value *v)
{
	switch (v->type) {
	case KILN_META_U8:
	case KILN_META_U16:
	case KILN_META_U32:
	case KILN_META_U64:
		return json_object_new_uint64(v->num.u);
	case KILN_META_I8:
	case KILN_META_I16:
	case KILN_META_I32:
	case KILN_META_I64:
		return json_object_new_int64(v->num.i);
	case KILN_META_F32:
	case KILN_META_F64:
		return json_float(v->num.f, v->type == KILN_META_F32);
	case KILN_META_BOOL:
		return json_object_new_boolean(v->num.u != 0);
	case KILN_META_STRING:
		return json_string_or_bytes(v->str, v->str_len);
	case KILN_META_ARRAY: {
		json_object *o = json_object_new_object();
		size_t hint = v->count < 4096 ? (size_t)v->count + 1 : 4096;
		json_object *items = json_object_new_array_ext((int)hint);
		json_object *t = json_object_new_string(type_names[v->item_type]);
		if (!o || !items || !t || json_object_object_add(o, "type", t)) {
			json_object_put(o);
			json_object_put(items);
			json_object_put(t);
			return NULL;
		}
		json_object_object_add(o, "items", items);
		kiln_value_iter it;
		kiln_value item;
		kiln_value_iter_init(&it, v);
		while (kiln_value_next(&it, &item)) {
			json_object *x = json_value(&item);
			if (!x || json_object_array_add(items, x)) {
				json_object_put(x);
				json_object_put(o);
				return NULL;
			}
		}
		return o;
	}
	}
	return NULL;
}

/* {"type": T, "value": V} */
static json_object *json_typed(uint32_t type, json_object *value)
{
	json_object *o = json_object_new_object(), *t = json_object_new_string(type_names[type]);
	if (!o || !t || !value || json_object_object_add(o, "type", t)) {
		json_object_put(o);
		json_object_put(t);
		json_object_put(value);
		return NULL;
	}
	json_object_object_add(o, "value", value);
	return o;
}

/* --- the JSON convention to GGUF's encoding ------------------------------------------------- */

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

/* A float value back to its bits: a JSON number, or "bits:0x..." for NaN and infinities. */
static int float_bits(json_object *v, int is32, uint64_t *out)
{
	if (json_object_is_type(v, json_type_string)) {
		const char *s = json_object_get_string(v);
		size_t n = strlen(s), want = is32 ? 8 : 16;
		if (n != 7 + want || strncmp(s, "bits:0x", 7) != 0)
			return -1;
		uint64_t bits = 0;
		for (size_t i = 7; i < n; i++) {
			int h = hexval(s[i]);
			if (h < 0)
				return -1;
			bits = bits << 4 | (uint64_t)h;
		}
		*out = bits;
		return 0;
	}
	if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
		return -1;
	double d = json_object_get_double(v);
	if (is32) {
		float f = (float)d;
		uint32_t b;
		memcpy(&b, &f, 4);
		*out = b;
	} else {
		memcpy(out, &d, 8);
	}
	return 0;
}

/* Value v of type t, GGUF-encoded into b; INVAL naming the key when v does not fit t. */
static int put_value(struct kc_out *b, const char *key, int t, json_object *v, int depth,
		     kiln_error *err)
{
	static const int64_t lo[] = {0, INT8_MIN, 0, INT16_MIN, 0, INT32_MIN};
	static const int64_t hi[] = {UINT8_MAX, INT8_MAX,   UINT16_MAX,
				     INT16_MAX, UINT32_MAX, INT32_MAX};
	static const unsigned width[] = {1, 1, 2, 2, 4, 4};
	switch (t) {
	case KILN_META_U8:
	case KILN_META_I8:
	case KILN_META_U16:
	case KILN_META_I16:
	case KILN_META_U32:
	case KILN_META_I32: {
		int64_t x = json_object_get_int64(v);
		if (!json_object_is_type(v, json_type_int) || x < lo[t] || x > hi[t])
			break;
		kc_out_u(b, (uint64_t)x, width[t]);
		return 0;
	}
	case KILN_META_U64:
	case KILN_META_I64: {
		if (!json_object_is_type(v, json_type_int))
			break;
		int64_t x = json_object_get_int64(v);
		uint64_t u = json_object_get_uint64(v);
		if (t == KILN_META_U64 && x < 0)
			break;
		if (t == KILN_META_I64 && x == INT64_MAX && u != (uint64_t)INT64_MAX)
			break;
		kc_out_u(b, t == KILN_META_U64 ? u : (uint64_t)x, 8);
		return 0;
	}
	case KILN_META_F32:
	case KILN_META_F64: {
		uint64_t bits;
		if (float_bits(v, t == KILN_META_F32, &bits))
			break;
		kc_out_u(b, bits, t == KILN_META_F32 ? 4 : 8);
		return 0;
	}
	case KILN_META_BOOL:
		if (!json_object_is_type(v, json_type_boolean))
			break;
		kc_out_u(b, json_object_get_boolean(v) ? 1 : 0, 1);
		return 0;
	case KILN_META_STRING: {
		if (json_object_is_type(v, json_type_string)) {
			kc_out_u(b, (uint64_t)json_object_get_string_len(v), 8);
			kc_out_put(b, json_object_get_string(v),
				   (size_t)json_object_get_string_len(v));
			return 0;
		}
		json_object *h;
		if (!json_object_is_type(v, json_type_object) ||
		    !json_object_object_get_ex(v, "bytes", &h) ||
		    !json_object_is_type(h, json_type_string))
			break;
		const char *s = json_object_get_string(h);
		size_t n = (size_t)json_object_get_string_len(h);
		if (n % 2)
			break;
		kc_out_u(b, n / 2, 8);
		for (size_t i = 0; i < n; i += 2) {
			int x = hexval(s[i]), y = hexval(s[i + 1]);
			if (x < 0 || y < 0)
				return kiln_error_set(err, KILN_INVAL, 0,
						      "key %s: bad hex in a bytes string", key);
			uint8_t c = (uint8_t)(x << 4 | y);
			kc_out_put(b, &c, 1);
		}
		return 0;
	}
	case KILN_META_ARRAY: {
		json_object *ty, *items;
		if (depth >= MAX_DEPTH)
			return kiln_error_set(err, KILN_INVAL, 0,
					      "key %s: arrays nested deeper than %d", key,
					      MAX_DEPTH);
		if (!json_object_is_type(v, json_type_object) ||
		    !json_object_object_get_ex(v, "type", &ty) ||
		    !json_object_object_get_ex(v, "items", &items) ||
		    !json_object_is_type(items, json_type_array))
			break;
		int it = type_named(json_object_get_string(ty));
		if (it < 0)
			break;
		size_t n = json_object_array_length(items);
		kc_out_u(b, (uint64_t)it, 4);
		kc_out_u(b, n, 8);
		for (size_t i = 0; i < n; i++) {
			int rc = put_value(b, key, it, json_object_array_get_idx(items, i),
					   depth + 1, err);
			if (rc)
				return rc;
		}
		return 0;
	}
	}
	return kiln_error_set(err, KILN_INVAL, 0, "key %s: the value does not fit type %s", key,
			      t >= 0 && t < NTYPES ? type_names[t] : "?");
}

/* --- the model's metadata as key/values with JSON values ------------------------------------ */

struct jkv {
	char *key; /* owned, NUL-terminated for json-c; key_len bytes */
	size_t key_len;
	int type;         /* GGUF type; -1: a plain string (safetensors) */
	json_object *obj; /* {"type", "value"}, or the string */
};

struct jkvs {
	struct jkv *v;
	size_t n;
	int gguf; /* typed key/values (GGUF), or plain strings */
	uint32_t version, alignment;
};

static void jkvs_free(struct jkvs *k)
{
	for (size_t i = 0; i < k->n; i++) {
		free(k->v[i].key);
		json_object_put(k->v[i].obj);
	}
	free(k->v);
	memset(k, 0, sizeof(*k));
}

static json_object *parse_object(const char *s, size_t n)
{
	if (n > INT32_MAX)
		return NULL;
	json_tokener *tok = json_tokener_new_ex(JSON_DEPTH);
	if (!tok)
		return NULL;
	json_object *o = json_tokener_parse_ex(tok, s, (int)n);
	if (json_tokener_get_error(tok) != json_tokener_success ||
	    json_tokener_get_parse_end(tok) != n || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		o = NULL;
	}
	json_tokener_free(tok);
	return o;
}

/* The model's metadata, one list, whatever it came from. */
static int jkvs_make(const kiln_model *m, struct jkvs *out, kiln_error *err)
{
	memset(out, 0, sizeof(*out));
	const kiln_meta *e;
	uint64_t n;
	kiln_meta_origin origin;
	int rc = kiln_model_metadata(m, &e, &n, err);
	if (!rc)
		rc = kiln_model_meta_origin(m, &origin, err);
	if (rc)
		return rc;
	out->gguf = origin.format == KILN_FORMAT_GGUF;
	out->version = origin.version ? origin.version : 3;
	out->alignment = origin.alignment ? origin.alignment : 32;
	/* A safetensors file a kiln export wrote from GGUF: its key/values come back typed. */
	const kiln_meta *marker = NULL;
	for (uint64_t i = 0; !out->gguf && i < n; i++)
		if (e[i].key_len == strlen(MARKER) && !memcmp(e[i].key, MARKER, strlen(MARKER)) &&
		    e[i].value.type == KILN_META_STRING)
			marker = &e[i];
	if (marker) {
		json_object *mo = parse_object(marker->value.str, marker->value.str_len), *x;
		if (!mo)
			return kiln_error_set(err, KILN_INVAL, 0,
					      "metadata key %s is not a JSON object", MARKER);
		out->gguf = 1;
		if (json_object_object_get_ex(mo, "version", &x))
			out->version = (uint32_t)json_object_get_int64(x);
		if (json_object_object_get_ex(mo, "alignment", &x))
			out->alignment = (uint32_t)json_object_get_int64(x);
		json_object_put(mo);
	}
	out->v = calloc((size_t)(n ? n : 1), sizeof(*out->v));
	if (!out->v)
		return kc_nomem(err);
	for (uint64_t i = 0; i < n; i++) {
		const kiln_meta *k = &e[i];
		if (k == marker)
			continue;
		struct jkv *j = &out->v[out->n];
		/* All key_len bytes: a GGUF key may hold U+0000, where strndup would stop. */
		if (!(j->key = malloc(k->key_len + 1))) {
			rc = kc_nomem(err);
			break;
		}
		memcpy(j->key, k->key, k->key_len);
		j->key[k->key_len] = '\0';
		j->key_len = k->key_len;
		out->n++;
		char shown[KC_SHOWN];
		kc_shown(k->key, k->key_len, shown);
		if (marker) {
			json_object *t = NULL;
			j->obj = k->value.type == KILN_META_STRING
				     ? parse_object(k->value.str, k->value.str_len)
				     : NULL;
			if (!j->obj || !json_object_object_get_ex(j->obj, "type", &t) ||
			    (j->type = type_named(json_object_get_string(t))) < 0 ||
			    !json_object_object_get_ex(j->obj, "value", NULL)) {
				rc = kiln_error_set(err, KILN_INVAL, 0,
						    "metadata key %s is not {\"type\", \"value\"} "
						    "as kiln's export writes GGUF key/values",
						    shown);
				break;
			}
		} else if (out->gguf) {
			j->type = (int)k->value.type;
			j->obj = json_typed(k->value.type, json_value(&k->value));
		} else {
			j->type = -1;
			j->obj =
			    k->value.type == KILN_META_STRING
				? json_object_new_string_len(k->value.str, (int)k->value.str_len)
				: json_value(&k->value);
		}
		if (!j->obj) {
			rc = kc_nomem(err);
			break;
		}
	}
	if (rc)
		jkvs_free(out);
	return rc;
}

/* --- the three outputs --------------------------------------------------------------------- */

int kc_doc(const kiln_model *m, char **text, size_t *len, kiln_error *err)
{
	*text = NULL;
	*len = 0;
	struct jkvs k;
	int rc = jkvs_make(m, &k, err);
	if (rc)
		return rc;
	kiln_meta_origin origin;
	kiln_model_meta_origin(m, &origin, NULL);
	json_object *doc = json_object_new_object();
	if (!doc) {
		jkvs_free(&k);
		return kc_nomem(err);
	}
	json_object_object_add(doc, "kiln.metadata", json_object_new_int(1));
	const char *source = k.gguf ? "gguf" : kiln_format_name(origin.format);
	json_object_object_add(doc, "source", json_object_new_string(source));
	if (k.gguf) {
		json_object *g = json_object_new_object(), *kv = json_object_new_array();
		json_object_object_add(doc, "gguf", g);
		json_object_object_add(g, "version", json_object_new_int((int)k.version));
		json_object_object_add(g, "alignment", json_object_new_int64(k.alignment));
		json_object_object_add(g, "kv", kv);
		for (size_t i = 0; i < k.n; i++) {
			/* split.* describes the files of a split, not the model */
			if (k.v[i].key_len > 6 && !memcmp(k.v[i].key, "split.", 6))
				continue;
			json_object *e = json_object_new_object(), *t, *v;
			json_object_object_get_ex(k.v[i].obj, "type", &t);
			json_object_object_get_ex(k.v[i].obj, "value", &v);
			json_object_object_add(
			    e, "key", json_object_new_string_len(k.v[i].key, (int)k.v[i].key_len));
			json_object_object_add(e, "type", json_object_get(t));
			json_object_object_add(e, "value", json_object_get(v));
			json_object_array_add(kv, e);
		}
	} else if (k.n) {
		json_object *st = json_object_new_object(), *meta = json_object_new_object();
		json_object_object_add(doc, "safetensors", st);
		json_object_object_add(st, "metadata", meta);
		for (size_t i = 0; i < k.n && !rc; i++) {
			/* json-c's keys are C strings: one holding U+0000 would be cut, silently
			 * becoming (or overwriting) another key. */
			if (memchr(k.v[i].key, 0, k.v[i].key_len)) {
				char shown[KC_SHOWN];
				rc = kiln_error_set(err, KILN_INVAL, 0,
						    "metadata key %s holds U+0000, which the %s "
						    "document cannot keep",
						    kc_shown(k.v[i].key, k.v[i].key_len, shown),
						    KILN_METADATA_TENSOR);
				break;
			}
			json_object_object_add(meta, k.v[i].key, json_object_get(k.v[i].obj));
		}
	}
	size_t n;
	const char *s = rc ? NULL
			   : json_object_to_json_string_length(
				 doc, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
	if (s && (*text = malloc(n + 1))) {
		memcpy(*text, s, n + 1);
		*len = n;
	} else if (!rc) {
		rc = kc_nomem(err);
	}
	json_object_put(doc);
	jkvs_free(&k);
	return rc;
}

int kc_kvs_make(const kiln_model *m, struct kc_kvs *out, kiln_error *err)
{
	memset(out, 0, sizeof(*out));
	struct jkvs k;
	int rc = jkvs_make(m, &k, err);
	if (rc)
		return rc;
	out->version = k.version;
	out->alignment = k.alignment;
	out->v = calloc(k.n ? k.n : 1, sizeof(*out->v));
	if (!out->v) {
		jkvs_free(&k);
		return kc_nomem(err);
	}
	for (size_t i = 0; i < k.n && !rc; i++) {
		struct jkv *j = &k.v[i];
		if (j->key_len > 6 && !memcmp(j->key, "split.", 6))
			continue;
		char shown[KC_SHOWN];
		kc_shown(j->key, j->key_len, shown);
		struct kc_kv *kv = &out->v[out->n];
		json_object *v = NULL;
		if (j->type >= 0)
			json_object_object_get_ex(j->obj, "value", &v);
		kv->type = j->type < 0 ? KILN_META_STRING : (uint32_t)j->type;
		/* Sized, then written into a block of that size. */
		struct kc_out b = {0};
		for (int pass = 0; pass < 2 && !rc; pass++) {
			if (pass && !(b.p = malloc(b.len ? b.len : 1))) {
				rc = kc_nomem(err);
				break;
			}
			b.len = 0;
			if (j->type < 0) { /* safetensors' strings as GGUF strings */
				kc_out_u(&b, (uint64_t)json_object_get_string_len(j->obj), 8);
				kc_out_put(&b, json_object_get_string(j->obj),
					   (size_t)json_object_get_string_len(j->obj));
			} else {
				rc = put_value(&b, shown, j->type, v, 0, err);
			}
		}
		if (rc) {
			free(b.p);
			break;
		}
		/* The key: the jkv's, kept by moving it here. */
		kv->key = j->key;
		kv->key_len = j->key_len;
		j->key = NULL;
		kv->value = b.p;
		kv->value_len = b.len;
		out->n++;
	}
	jkvs_free(&k);
	if (rc)
		kc_kvs_free(out);
	return rc;
}

void kc_kvs_free(struct kc_kvs *k)
{
	for (size_t i = 0; i < k->n; i++) {
		free((char *)k->v[i].key);
		free(k->v[i].value);
	}
	free(k->v);
	memset(k, 0, sizeof(*k));
}

int kc_st_metadata(const kiln_model *m, json_object **out, kiln_error *err)
{
	*out = NULL;
	struct jkvs k;
	int rc = jkvs_make(m, &k, err);
	if (rc || !k.n) {
		jkvs_free(&k);
		return rc;
	}
	json_object *o = json_object_new_object();
	if (!o) {
		jkvs_free(&k);
		return kc_nomem(err);
	}
	if (k.gguf) {
		char marker[64];
		snprintf(marker, sizeof(marker),
			 "{\"version\":%" PRIu32 ",\"alignment\":%" PRIu32 "}", k.version,
			 k.alignment);
		json_object_object_add(o, MARKER, json_object_new_string(marker));
	}
	for (size_t i = 0; i < k.n && !rc; i++) {
		struct jkv *j = &k.v[i];
		if (memchr(j->key, 0, j->key_len)) {
			char shown[KC_SHOWN];
			rc = kiln_error_set(err, KILN_INVAL, 0,
					    "metadata key %s holds U+0000, which a safetensors "
					    "header key cannot",
					    kc_shown(j->key, j->key_len, shown));
			break;
		}
		if (k.gguf) {
			if (j->key_len > 6 && !memcmp(j->key, "split.", 6))
				continue;
			const char *s = json_object_to_json_string_ext(
			    j->obj, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
			json_object_object_add(o, j->key, json_object_new_string(s));
		} else {
			json_object_object_add(o, j->key, json_object_get(j->obj));
		}
	}
	jkvs_free(&k);
	if (rc) {
		json_object_put(o);
		return rc;
	}
	*out = o;
	return 0;
}
