/* SPDX-License-Identifier: MIT */
/* The model_signing statement reader (format/signing.h): pure, bytes in, digests or a located
 * error out; the count of digests is proven by the text before anything is allocated for it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/evp.h>

#include "base/json.h"
#include "format/signing.h"

#define BAD(code, at, ...) \
	kiln__fail_named(err, shown, code, KILN_NO_INDEX, "model_signing", at, __VA_ARGS__)

static const char STATEMENT_V1[] = "https://in-toto.io/Statement/v1";
static const char STATEMENT_V01[] = "https://in-toto.io/Statement/v0.1";
static const char PREDICATE_V1[] = "https://model_signing/signature/v1.0";
static const char PAYLOAD_TYPE[] = "application/vnd.in-toto+json";
static const char SHARDED[] = "sha256-sharded-";

#define IS(s, lit) kiln__json_str_is(s, lit, sizeof(lit) - 1)

/* A resource name longer than this names no file kiln opens (PATH_MAX). */
#define NAME_MAX_BYTES 4096

struct scan {
	const char *shown, *name;
	size_t name_len;
	struct kiln__signed *out; /* NULL on the counting pass */
	size_t n;
};

/* The JSON reader's defect, in its class, or a TYPE for a value of the wrong kind. */
static int json_bad(const struct kiln__json *j, const char *shown, const char *what,
		    kiln_error *err)
{
	if (j->code)
		return BAD(j->code, j->at, "statement: %s", j->what ? j->what : "malformed JSON");
	return BAD(KILN_TYPE, j->pos, "statement: %s", what);
}

static int string_member(struct kiln__json *j, struct kiln__json_str *s, const char *shown,
			 const char *what, kiln_error *err)
{
	if (kiln__json_peek(j) != KILN__JSON_STRING || kiln__json_string(j, s))
		return json_bad(j, shown, what, err);
	return 0;
}

/* "PATH:START:END" split at its last two colons: 0 with the numbers and PATH's length. */
static int shard_name(const uint8_t *s, size_t n, size_t *path_len, uint64_t *from, uint64_t *to)
{
	size_t c2 = n, c1;
	while (c2 > 0 && s[c2 - 1] != ':')
		c2--;
	if (c2 == 0)
		return -1;
	c1 = c2 - 1;
	while (c1 > 0 && s[c1 - 1] != ':')
		c1--;
	if (c1 == 0)
		return -1;
	if (kiln__json_u64(s + c1, c2 - 1 - c1, from) || kiln__json_u64(s + c2, n - c2, to))
		return -1;
	*path_len = c1 - 1;
	return 0;
}

static int resource(struct kiln__json *j, struct scan *sc, kiln_error *err)
{
	const char *shown = sc->shown;
	size_t at = j->pos;
	struct kiln__json_str key, name = {0}, alg = {0}, digest = {0};
	int have = 0;
	if (kiln__json_peek(j) != KILN__JSON_OBJECT || kiln__json_enter(j, KILN__JSON_OBJECT))
		return json_bad(j, shown, "a resource is not an object", err);
	while (kiln__json_member(j, &key)) {
		struct kiln__json_str *v = IS(&key, "name")        ? &name
					   : IS(&key, "algorithm") ? &alg
					   : IS(&key, "digest")    ? &digest
								   : NULL;
		int rc = v                    ? string_member(j, v, shown,
							      "a resource's name, algorithm and digest "
										 "are strings",
							      err)
			 : kiln__json_skip(j) ? json_bad(j, shown, "", err)
					      : 0;
		if (rc)
			return rc;
		have |= v == &name ? 1 : v == &alg ? 2 : v == &digest ? 4 : 0;
	}
	if (j->code)
		return json_bad(j, shown, "", err);
	if (have != 7)
		return BAD(KILN_TYPE, at,
			   "statement: a resource without its name, algorithm or digest");
	/* Decoding never lengthens: a name longer than any path names no file of ours. */
	if (name.raw_len > NAME_MAX_BYTES)
		return 0;
	uint8_t nb[NAME_MAX_BYTES];
	size_t nl = kiln__json_decode(&name, nb);
	int sharded = alg.raw_len > sizeof(SHARDED) - 1 && !alg.escaped &&
		      !memcmp(alg.raw, SHARDED, sizeof(SHARDED) - 1);
	uint64_t from = 0, to = UINT64_MAX;
	size_t path_len = nl;
	if (sharded && shard_name(nb, nl, &path_len, &from, &to))
		return BAD(KILN_TYPE, name.at,
			   "statement: a shard's name is PATH:START:END, with two numbers");
	if (path_len != sc->name_len || memcmp(nb, sc->name, path_len))
		return 0; /* another file's */
	if (!sharded && !IS(&alg, "sha256")) {
		char a[64];
		size_t al = alg.raw_len < sizeof(a) - 1 ? alg.raw_len : sizeof(a) - 1;
		memcpy(a, alg.raw, al);
		a[al] = 0;
		return BAD(KILN_UNSUPPORTED, alg.at,
			   "statement: %s is listed in %s; kiln checks sha256 digests", sc->name,
			   a);
	}
	if (sharded && from >= to)
		return BAD(KILN_TYPE, name.at,
			   "statement: shard %" PRIu64 ":%" PRIu64 " of %s is empty or reversed",
			   from, to, sc->name);
	uint8_t d[KILN__SHA256_LEN];
	if (digest.escaped || digest.raw_len != 2 * KILN__SHA256_LEN ||
	    kiln__hex_bytes(digest.raw, KILN__SHA256_LEN, d))
		return BAD(KILN_TYPE, digest.at, "statement: a sha256 digest is 64 hex digits");
	if (sc->out) {
		struct kiln__signed *e = &sc->out[sc->n];
		e->from = from;
		e->to = to;
		memcpy(e->sha256, d, sizeof(d));
	}
	sc->n++;
	return 0;
}

/* The predicate's resources, at `at` of the text. */
static int predicate(const uint8_t *text, size_t len, size_t at, struct scan *sc, kiln_error *err)
{
	const char *shown = sc->shown;
	struct kiln__json j;
	kiln__json_init(&j, text + at, len - at, 64);
	struct kiln__json_str key;
	int found = 0;
	if (kiln__json_peek(&j) != KILN__JSON_OBJECT || kiln__json_enter(&j, KILN__JSON_OBJECT))
		return BAD(KILN_TYPE, at, "statement: the predicate is not an object");
	while (kiln__json_member(&j, &key)) {
		if (!IS(&key, "resources")) {
			if (kiln__json_skip(&j))
				break;
			continue;
		}
		found = 1;
		if (kiln__json_peek(&j) != KILN__JSON_ARRAY ||
		    kiln__json_enter(&j, KILN__JSON_ARRAY))
			return BAD(KILN_TYPE, at + j.pos, "statement: resources is not an array");
		while (kiln__json_item(&j)) {
			int rc = resource(&j, sc, err);
			if (rc) {
				if (err)
					err->offset += at; /* j's offsets start at the predicate */
				return rc;
			}
		}
		if (j.code)
			break;
	}
	if (j.code)
		return BAD(j.code, at + j.at, "statement: %s", j.what ? j.what : "malformed JSON");
	return found ? 0 : BAD(KILN_TYPE, at, "statement: the predicate lists no resources");
}

/* A statement (its text checked to be UTF-8 already): its type and predicate type checked, its
 * resources scanned. */
static int statement(const uint8_t *text, size_t len, struct scan *sc, kiln_error *err)
{
	const char *shown = sc->shown;
	struct kiln__json j;
	kiln__json_init(&j, text, len, 64);
	struct kiln__json_str key, type = {0}, ptype = {0};
	size_t pred_at = SIZE_MAX;
	if (kiln__json_peek(&j) != KILN__JSON_OBJECT || kiln__json_enter(&j, KILN__JSON_OBJECT))
		return j.code ? json_bad(&j, shown, "", err)
			      : BAD(KILN_FRAME, 0,
				    "not a model_signing statement or bundle "
				    "(not a JSON object)");
	while (kiln__json_member(&j, &key)) {
		int rc = 0;
		if (IS(&key, "_type"))
			rc = string_member(&j, &type, shown, "_type is a string", err);
		else if (IS(&key, "predicateType"))
			rc = string_member(&j, &ptype, shown, "predicateType is a string", err);
		else {
			if (IS(&key, "predicate")) {
				kiln__json_peek(&j); /* past the whitespace */
				pred_at = j.pos;
			}
			if (kiln__json_skip(&j))
				break;
		}
		if (rc)
			return rc;
	}
	if (j.code || kiln__json_finish(&j))
		return json_bad(&j, shown, "", err);
	if (!type.raw || !(IS(&type, STATEMENT_V1) || IS(&type, STATEMENT_V01)))
		return BAD(KILN_FRAME, type.raw ? type.at : 0,
			   "not an in-toto statement (its _type is not %s)", STATEMENT_V1);
	if (!ptype.raw || !IS(&ptype, PREDICATE_V1))
		return BAD(KILN_UNSUPPORTED, ptype.raw ? ptype.at : 0,
			   "statement: its predicate type is not %s, the one kiln reads",
			   PREDICATE_V1);
	if (pred_at == SIZE_MAX)
		return BAD(KILN_TYPE, 0, "statement: no predicate");
	return predicate(text, len, pred_at, sc, err);
}

/* A bundle's in-toto payload, decoded from base64 into *out (malloc'd); 0 or FRAME/TYPE/NOMEM. */
static int payload(const struct kiln__json_str *p, const char *shown, uint8_t **out, size_t *n,
		   kiln_error *err)
{
	uint8_t *b64 = malloc(p->raw_len + 1);
	if (!b64)
		return kiln__nomem(err, p->raw_len + 1, "a bundle's payload");
	size_t bl = kiln__json_decode(p, b64);
	/* Standard base64, padded: 4 characters for each 3 bytes. */
	uint8_t *dec = bl % 4 == 0 ? malloc(bl / 4 * 3 + 1) : NULL;
	if (bl % 4 != 0) {
		free(b64);
		return BAD(KILN_FRAME, p->at, "bundle: the payload is not base64 (%zu characters)",
			   bl);
	}
	if (!dec) {
		free(b64);
		return kiln__nomem(err, bl / 4 * 3 + 1, "a bundle's payload");
	}
	int got = bl ? EVP_DecodeBlock(dec, b64, (int)bl) : 0;
	size_t pad = bl && b64[bl - 1] == '=' ? (bl > 1 && b64[bl - 2] == '=' ? 2 : 1) : 0;
	free(b64);
	if (got < 0 || (size_t)got < pad || bl > INT32_MAX) {
		free(dec);
		return BAD(KILN_FRAME, p->at, "bundle: the payload is not base64");
	}
	*out = dec;
	*n = (size_t)got - pad;
	return 0;
}

/* The text's statement: itself, or a bundle's DSSE payload (*owned then holds it); either
 * checked to be UTF-8, once, for the two passes over it. */
static int find_statement(const uint8_t *text, size_t len, const char *shown, const uint8_t **st,
			  size_t *st_len, uint8_t **owned, kiln_error *err)
{
	*owned = NULL;
	*st = text;
	*st_len = len;
	size_t b = kiln__utf8_check(text, len);
	if (b != SIZE_MAX)
		return BAD(KILN_UTF8, b, "byte %zu is not well-formed UTF-8", b);
	struct kiln__json j;
	kiln__json_init(&j, text, len, 64);
	struct kiln__json_str key, pl = {0}, ptype = {0};
	int envelope = 0;
	if (kiln__json_peek(&j) != KILN__JSON_OBJECT || kiln__json_enter(&j, KILN__JSON_OBJECT))
		return 0; /* the statement reader says what it is not */
	while (kiln__json_member(&j, &key)) {
		if (!IS(&key, "dsseEnvelope")) {
			if (kiln__json_skip(&j))
				break;
			continue;
		}
		envelope = 1;
		if (kiln__json_peek(&j) != KILN__JSON_OBJECT ||
		    kiln__json_enter(&j, KILN__JSON_OBJECT))
			return json_bad(&j, shown, "bundle: dsseEnvelope is not an object", err);
		while (kiln__json_member(&j, &key)) {
			int rc = 0;
			if (IS(&key, "payload"))
				rc = string_member(&j, &pl, shown, "bundle: payload is a string",
						   err);
			else if (IS(&key, "payloadType"))
				rc = string_member(&j, &ptype, shown,
						   "bundle: payloadType is a string", err);
			else if (kiln__json_skip(&j))
				break;
			if (rc)
				return rc;
		}
		if (j.code)
			break;
	}
	if (j.code)
		return json_bad(&j, shown, "", err);
	if (!envelope)
		return 0; /* a bare statement */
	if (!ptype.raw || !IS(&ptype, PAYLOAD_TYPE))
		return BAD(KILN_UNSUPPORTED, ptype.raw ? ptype.at : 0,
			   "bundle: its payload type is not %s", PAYLOAD_TYPE);
	if (!pl.raw)
		return BAD(KILN_TYPE, 0, "bundle: its envelope has no payload");
	int rc = payload(&pl, shown, owned, st_len, err);
	*st = *owned;
	if (!rc && (b = kiln__utf8_check(*st, *st_len)) != SIZE_MAX)
		rc = BAD(KILN_UTF8, b, "statement: byte %zu is not well-formed UTF-8", b);
	return rc;
}

static int by_offset(const void *a, const void *b)
{
	const struct kiln__signed *x = a, *y = b;
	return x->from < y->from ? -1 : x->from > y->from;
}

int kiln__signing_digests(const uint8_t *text, size_t len, const char *shown, const char *name,
			  struct kiln__signed **out, size_t *n, kiln_error *err)
{
	*out = NULL;
	*n = 0;
	const uint8_t *st;
	size_t st_len;
	uint8_t *owned;
	int rc = find_statement(text, len, shown, &st, &st_len, &owned, err);
	struct scan sc = {.shown = shown, .name = name, .name_len = strlen(name)};
	/* Count, then fill: the text proves the count before it is allocated. */
	if (!rc)
		rc = statement(st, st_len, &sc, err);
	if (!rc && sc.n) {
		size_t count = sc.n;
		sc.out = malloc(count * sizeof(*sc.out));
		sc.n = 0;
		rc = sc.out ? statement(st, st_len, &sc, err)
			    : kiln__nomem(err, count * sizeof(*sc.out), "a statement's digests");
	}
	free(owned);
	if (!rc && sc.n) {
		qsort(sc.out, sc.n, sizeof(*sc.out), by_offset);
		for (size_t i = 1; i < sc.n && !rc; i++) {
			if (sc.out[i - 1].to == UINT64_MAX || sc.out[i].to == UINT64_MAX)
				rc = BAD(KILN_TYPE, 0,
					 "statement: %s is listed whole and in shards", name);
			else if (sc.out[i].from < sc.out[i - 1].to)
				rc = BAD(KILN_TYPE, 0,
					 "statement: shards %" PRIu64 ":%" PRIu64 " and %" PRIu64
					 ":%" PRIu64 " of %s overlap",
					 sc.out[i - 1].from, sc.out[i - 1].to, sc.out[i].from,
					 sc.out[i].to, name);
		}
	}
	if (rc) {
		free(sc.out);
		return rc;
	}
	*out = sc.out;
	*n = sc.n;
	return 0;
}
