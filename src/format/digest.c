/* SPDX-License-Identifier: MIT */
#include <inttypes.h>
#include <stdio.h>

#include <openssl/evp.h>

#include "format/digest.h"

#include <xxh_x86dispatch.h>

/* The head's fields, at their offsets. */
enum {
	AT_MAGIC = 0,
	AT_VERSION = 8,
	AT_ALGORITHM = 10,
	AT_LOG2 = 12,
	AT_RESERVED = 13,
	AT_FILE_SIZE = KILN__DIGEST_SIZE_AT,
	AT_FROM = KILN__DIGEST_FROM_AT,
	AT_TO = 32,
	AT_CHUNKS = 40,
	AT_SELF = KILN__DIGEST_SELF,
};

void kiln__digest_bytes(const void *p, size_t n, uint8_t out[KILN__DIGEST_LEN])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
	memcpy(out, c.digest, KILN__DIGEST_LEN);
}

void kiln__digest_begin(kiln__digest_state *s)
{
	XXH3_128bits_reset(s);
}

void kiln__digest_add(kiln__digest_state *s, const void *p, size_t n)
{
	XXH3_128bits_update(s, p, n);
}

void kiln__digest_end(kiln__digest_state *s, uint8_t out[KILN__DIGEST_LEN])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
	memcpy(out, c.digest, KILN__DIGEST_LEN);
}

void kiln__digest_hex(const uint8_t d[KILN__DIGEST_LEN], char out[2 * KILN__DIGEST_LEN + 1])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < KILN__DIGEST_LEN; i++) {
		out[2 * i] = hex[d[i] >> 4];
		out[2 * i + 1] = hex[d[i] & 15];
	}
	out[2 * KILN__DIGEST_LEN] = '\0';
}

/* The table's own digest: its head before this field, then every chunk digest. */
static void self_digest(const uint8_t *table, const uint8_t *entries, uint64_t chunks,
			uint8_t out[KILN__DIGEST_LEN])
{
	XXH3_state_t s;
	XXH3_128bits_reset(&s);
	XXH3_128bits_update(&s, table, AT_SELF);
	XXH3_128bits_update(&s, entries, (size_t)chunks * KILN__DIGEST_LEN);
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&s));
	memcpy(out, c.digest, KILN__DIGEST_LEN);
}

static uint64_t chunks_of(uint64_t from, uint64_t to, unsigned log2)
{
	uint64_t n = to - from;
	return (n >> log2) + ((n & ((UINT64_C(1) << log2) - 1)) != 0);
}

size_t kiln__digests_size(uint64_t from, uint64_t to, unsigned log2)
{
	uint64_t bytes;
	if (to < from || kiln__mul_overflows(chunks_of(from, to, log2), KILN__DIGEST_LEN, &bytes) ||
	    kiln__add_overflows(bytes, KILN__DIGEST_HEAD, &bytes) || bytes > SIZE_MAX)
		return 0;
	return (size_t)bytes;
}

void kiln__digests_seal(uint8_t *table, size_t len, uint64_t file_size, uint64_t from, uint64_t to,
			unsigned log2)
{
	memset(table, 0, KILN__DIGEST_HEAD);
	memcpy(table + AT_MAGIC, KILN__DIGEST_MAGIC, 8);
	kiln__st16(table + AT_VERSION, KILN__DIGEST_VERSION);
	kiln__st16(table + AT_ALGORITHM, KILN__DIGEST_XXH3_128);
	table[AT_LOG2] = (uint8_t)log2;
	kiln__st64(table + AT_FILE_SIZE, file_size);
	kiln__st64(table + AT_FROM, from);
	kiln__st64(table + AT_TO, to);
	uint64_t chunks = (len - KILN__DIGEST_HEAD) / KILN__DIGEST_LEN;
	kiln__st64(table + AT_CHUNKS, chunks);
	self_digest(table, table + KILN__DIGEST_HEAD, chunks, table + AT_SELF);
}

void kiln__digest_writer_init(struct kiln__digest_writer *w, uint8_t *table, size_t len,
			      uint64_t from, uint64_t to, unsigned log2)
{
	*w = (struct kiln__digest_writer){
	    .table = table, .len = len, .from = from, .to = to, .log2 = log2};
}

void kiln__digest_writer_add(struct kiln__digest_writer *w, const void *data, size_t n)
{
	const uint8_t *p = data;
	const uint64_t chunk = UINT64_C(1) << w->log2;
	if (w->at < w->from) { /* bytes before the table's range */
		uint64_t skip = w->from - w->at < n ? w->from - w->at : n;
		p += skip;
		n -= (size_t)skip;
		w->at += skip;
	}
	if (w->at + n > w->to) /* bytes after it */
		n = w->at < w->to ? (size_t)(w->to - w->at) : 0;
	while (n) {
		uint64_t left = chunk - w->in_chunk;
		if (left > w->to - w->at)
			left = w->to - w->at; /* the last chunk is shorter */
		size_t take = (size_t)(left < n ? left : n);
		uint8_t *out = w->table + KILN__DIGEST_HEAD + w->k * KILN__DIGEST_LEN;
		if (!w->in_chunk && take == left) {
			kiln__digest_bytes(p, take, out); /* a whole chunk at once */
		} else {
			if (!w->in_chunk)
				XXH3_128bits_reset(&w->s);
			XXH3_128bits_update(&w->s, p, take);
			w->in_chunk += take;
			if (take == left) {
				XXH128_canonical_t c;
				XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&w->s));
				memcpy(out, c.digest, KILN__DIGEST_LEN);
			}
		}
		if (take == left) {
			w->k++;
			w->in_chunk = 0;
		}
		p += take;
		n -= take;
		w->at += take;
	}
}

void kiln__digest_writer_seal(struct kiln__digest_writer *w, uint64_t file_size)
{
	kiln__digests_seal(w->table, w->len, file_size, w->from, w->to, w->log2);
}

size_t kiln__base64_len(size_t n)
{
	return (n + 2) / 3 * 4;
}

void kiln__base64_encode(const uint8_t *p, size_t n, char *out)
{
	/* OpenSSL's encoder takes an int: a table past 1.5 GB is encoded in parts. */
	const size_t part = (size_t)3 << 28;
	while (n > part) {
		EVP_EncodeBlock((unsigned char *)out, p, (int)part);
		p += part;
		n -= part;
		out += part / 3 * 4;
	}
	EVP_EncodeBlock((unsigned char *)out, p, (int)n);
}

static int b64(uint8_t c)
{
	return c >= 'A' && c <= 'Z'   ? c - 'A'
	       : c >= 'a' && c <= 'z' ? c - 'a' + 26
	       : c >= '0' && c <= '9' ? c - '0' + 52
	       : c == '+'             ? 62
	       : c == '/'             ? 63
				      : -1;
}

int kiln__base64_decode(const uint8_t *s, size_t n, uint8_t *out, size_t *got)
{
	*got = 0;
	if (n % 4)
		return -1;
	size_t o = 0;
	for (size_t i = 0; i < n; i += 4) {
		int last = i + 4 == n;
		int v[4];
		for (int j = 0; j < 4; j++)
			v[j] = b64(s[i + j]);
		/* '=' only in the last group's last one or two places. */
		int pad = last && s[i + 3] == '=' ? (s[i + 2] == '=' ? 2 : 1) : 0;
		if (v[0] < 0 || v[1] < 0 || (v[2] < 0 && pad < 2) || (v[3] < 0 && pad < 1))
			return -1;
		uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
			     (uint32_t)(pad < 2 ? v[2] : 0) << 6 | (uint32_t)(pad < 1 ? v[3] : 0);
		out[o++] = (uint8_t)(x >> 16);
		if (pad < 2)
			out[o++] = (uint8_t)(x >> 8);
		if (pad < 1)
			out[o++] = (uint8_t)x;
	}
	*got = o;
	return 0;
}

/* A broken rule: "digest table: WHY" after the table's name (kiln__fail_named). */
#define BAD(code, at, ...)                                               \
	kiln__fail_named(err, shown, code, KILN_NO_INDEX, "digests", at, \
			 "digest table: " __VA_ARGS__)

int kiln__digests_parse(const uint8_t *p, size_t len, const char *shown, struct kiln__digests *d,
			kiln_error *err)
{
	memset(d, 0, sizeof(*d));
	if (len < KILN__DIGEST_HEAD)
		return BAD(KILN_LIMIT, len, "%zu bytes, shorter than its %d-byte head", len,
			   KILN__DIGEST_HEAD);
	if (memcmp(p + AT_MAGIC, KILN__DIGEST_MAGIC, 8))
		return BAD(KILN_FRAME, AT_MAGIC, "no magic \"" KILN__DIGEST_MAGIC "\"");
	if (kiln__ld16(p + AT_VERSION) != KILN__DIGEST_VERSION)
		return BAD(KILN_FRAME, AT_VERSION, "version %u, not %d", kiln__ld16(p + AT_VERSION),
			   KILN__DIGEST_VERSION);
	for (int i = AT_RESERVED; i < AT_FILE_SIZE; i++)
		if (p[i])
			return BAD(KILN_FRAME, (uint64_t)i, "reserved byte %d is not 0", i);
	d->algorithm = kiln__ld16(p + AT_ALGORITHM);
	if (d->algorithm != KILN__DIGEST_XXH3_128)
		return BAD(KILN_UNSUPPORTED, AT_ALGORITHM,
			   "algorithm %" PRIu32 " is not one this build knows (1: XXH3-128)",
			   d->algorithm);
	d->chunk_log2 = p[AT_LOG2];
	if (d->chunk_log2 < KILN__DIGEST_LOG2_MIN || d->chunk_log2 > KILN__DIGEST_LOG2_MAX)
		return BAD(KILN_TYPE, AT_LOG2, "chunks of 2^%" PRIu32 " bytes, outside 2^%d..2^%d",
			   d->chunk_log2, KILN__DIGEST_LOG2_MIN, KILN__DIGEST_LOG2_MAX);
	d->file_size = kiln__ld64(p + AT_FILE_SIZE);
	d->from = kiln__ld64(p + AT_FROM);
	d->to = kiln__ld64(p + AT_TO);
	d->chunks = kiln__ld64(p + AT_CHUNKS);
	if (d->from > d->to || d->to > d->file_size)
		return BAD(KILN_TYPE, AT_FROM,
			   "it covers bytes %" PRIu64 "..%" PRIu64 ", not within a file of %" PRIu64
			   " bytes",
			   d->from, d->to, d->file_size);
	uint64_t want = chunks_of(d->from, d->to, d->chunk_log2);
	if (d->chunks != want)
		return BAD(KILN_TYPE, AT_CHUNKS,
			   "%" PRIu64 " chunk digests for bytes %" PRIu64 "..%" PRIu64
			   ", which are %" PRIu64 " chunks",
			   d->chunks, d->from, d->to, want);
	/* The count is proven by the bytes before any use of it. */
	uint64_t avail = (len - KILN__DIGEST_HEAD) / KILN__DIGEST_LEN;
	if (d->chunks > avail)
		return BAD(KILN_LIMIT, AT_CHUNKS,
			   "%" PRIu64 " chunk digests, but its %zu bytes hold %" PRIu64, d->chunks,
			   len, avail);
	uint64_t end = KILN__DIGEST_HEAD + d->chunks * KILN__DIGEST_LEN;
	if (len != end)
		return BAD(KILN_FRAME, end, "%zu bytes after its last chunk digest",
			   (size_t)(len - end));
	d->entries = p + KILN__DIGEST_HEAD;
	self_digest(p, d->entries, d->chunks, d->self);
	if (memcmp(d->self, p + AT_SELF, KILN__DIGEST_LEN)) {
		char want_hex[33], got_hex[33];
		kiln__digest_hex(p + AT_SELF, want_hex);
		kiln__digest_hex(d->self, got_hex);
		return BAD(KILN_CORRUPT, AT_SELF,
			   "damaged: its own digest says %s, its bytes give %s", want_hex, got_hex);
	}
	return 0;
}

struct kiln__sha256 *kiln__sha256_new(void)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(c);
		c = NULL;
	}
	return (struct kiln__sha256 *)c;
}

void kiln__sha256_add(struct kiln__sha256 *s, const void *p, size_t n)
{
	EVP_DigestUpdate((EVP_MD_CTX *)s, p, n);
}

void kiln__sha256_end(struct kiln__sha256 *s, uint8_t out[KILN__SHA256_LEN])
{
	unsigned len = 0;
	EVP_DigestFinal_ex((EVP_MD_CTX *)s, out, &len);
	EVP_DigestInit_ex((EVP_MD_CTX *)s, EVP_sha256(), NULL);
}

void kiln__sha256_free(struct kiln__sha256 *s)
{
	EVP_MD_CTX_free((EVP_MD_CTX *)s);
}

int kiln__hex_bytes(const uint8_t *hex, size_t n, uint8_t *out)
{
	for (size_t i = 0; i < n; i++) {
		int hi = kiln__hex_digit(hex[2 * i]), lo = kiln__hex_digit(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}
