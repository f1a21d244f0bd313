/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the digest table (src/format/digest.h), what a sidecar beside a model holds and
 * what kiln's writers put in the files themselves. The first byte picks how the rest is taken:
 * bit 0 clear, with its own digest (bytes 48..63) recomputed first, so that the fuzzer reaches
 * the fields behind that check; bit 1 set, as base64 text (a safetensors __metadata__ value),
 * decoded strictly first, judged against a decoder written here from RFC 4648.
 *
 * Judged against the target's own reading of the rules (docs/integrity.md, in their order): the
 * verdict's class and offset, and for an accepted table its fields and that sealing a table
 * with those fields gives back the same bytes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>
/* The state on the stack: its layout is this libxxhash's (Debian's headers and library agree). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "format/digest.h"
#include "fuzz.h"

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The self digest, written here from the rule: XXH3-128 of bytes [0, 48) then [64, len). */
static void self(const uint8_t *t, size_t len, uint8_t out[16])
{
	XXH3_state_t s;
	XXH3_128bits_reset(&s);
	XXH3_128bits_update(&s, t, 48);
	XXH3_128bits_update(&s, t + 64, len - 64);
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&s));
	memcpy(out, c.digest, 16);
}

/* The verdict the rules give: a code and the offset it names. */
static int judge(const uint8_t *t, size_t len, uint64_t *at)
{
	if (len < 64)
		return *at = len, KILN_LIMIT;
	if (memcmp(t, "KILNDGST", 8))
		return *at = 0, KILN_FRAME;
	if (t[8] != 1 || t[9] != 0)
		return *at = 8, KILN_FRAME;
	for (int i = 13; i < 16; i++)
		if (t[i])
			return *at = (uint64_t)i, KILN_FRAME;
	if (t[10] != 1 || t[11] != 0)
		return *at = 10, KILN_UNSUPPORTED;
	if (t[12] < 12 || t[12] > 30)
		return *at = 12, KILN_TYPE;
	uint64_t size = le64(t + 16), from = le64(t + 24), to = le64(t + 32), n = le64(t + 40);
	if (from > to || to > size)
		return *at = 24, KILN_TYPE;
	uint64_t c = ((to - from) >> t[12]) + (((to - from) & ((UINT64_C(1) << t[12]) - 1)) != 0);
	if (n != c)
		return *at = 40, KILN_TYPE;
	if (n > (len - 64) / 16)
		return *at = 40, KILN_LIMIT;
	if (len != 64 + n * 16)
		return *at = 64 + n * 16, KILN_FRAME;
	uint8_t d[16];
	self(t, len, d);
	if (memcmp(d, t + 48, 16))
		return *at = 48, KILN_CORRUPT;
	return *at = 0, 0;
}

/* Standard base64, padded, strictly: -1 for anything else. Bits the padding drops may be
 * anything (the table's own digest decides what the bytes are worth). */
static long long unbase64(const uint8_t *s, size_t n, uint8_t *out)
{
	static const char abc[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	if (n % 4)
		return -1;
	size_t o = 0;
	for (size_t i = 0; i < n; i += 4) {
		uint32_t v = 0;
		int pad = 0;
		for (int j = 0; j < 4; j++) {
			const char *c = s[i + j] ? strchr(abc, s[i + j]) : NULL;
			if (s[i + j] == '=' && i + 4 == n && j >= 2 &&
			    (j == 3 || s[i + 3] == '=')) {
				pad++;
				v <<= 6;
				continue;
			}
			if (!c || pad)
				return -1;
			v = v << 6 | (uint32_t)(c - abc);
		}
		out[o++] = (uint8_t)(v >> 16);
		if (pad < 2)
			out[o++] = (uint8_t)(v >> 8);
		if (pad < 1)
			out[o++] = (uint8_t)v;
	}
	return (long long)o;
}

int kiln_fuzz_digest(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t len = size - 1;
	uint8_t *t = malloc(len ? len : 1);
	if (!t)
		return 0;
	memcpy(t, data + 1, len);
	if (data[0] & 2) {
		/* base64 text: kiln's strict decoding against this one's; the table it gives is
		 * then judged as raw bytes, and its encoding decodes back to it. */
		uint8_t *want = malloc(len / 4 * 3 + 1), *got = malloc(len / 4 * 3 + 1);
		FUZZ_CHECK(want && got, "out of memory");
		long long wn = unbase64(t, len, want);
		size_t gn;
		int bad = kiln__base64_decode(t, len, got, &gn);
		FUZZ_CHECK((wn < 0) == (bad != 0), "base64: kiln %s, the rules %s",
			   bad ? "refuses" : "accepts", wn < 0 ? "refuse" : "accept");
		if (!bad) {
			FUZZ_CHECK((long long)gn == wn && !memcmp(got, want, gn), "base64 bytes");
			char *text = malloc(kiln__base64_len(gn) + 1);
			FUZZ_CHECK(text != NULL, "out of memory");
			kiln__base64_encode(got, gn, text);
			size_t back;
			FUZZ_CHECK(!kiln__base64_decode((const uint8_t *)text, strlen(text), want,
							&back) &&
				       back == gn && !memcmp(want, got, gn),
				   "encoded, decoded: other bytes");
			free(text);
			memcpy(t, got, gn);
			len = gn;
		}
		free(want);
		free(got);
		if (bad) {
			free(t);
			return 0;
		}
	}
	if (!(data[0] & 1) && len >= 64)
		self(t, len, t + 48);
	uint64_t want_at;
	int want = judge(t, len, &want_at);
	struct kiln__digests d;
	kiln_error err;
	int rc = kiln__digests_parse(t, len, "F", &d, &err);
	FUZZ_CHECK(rc == want, "%s, the rules say %s: %s", kiln_code_name(rc), kiln_code_name(want),
		   rc ? err.message : "");
	if (rc) {
		FUZZ_CHECK(err.offset == want_at, "offset %llu, the rules say %llu: %s",
			   (unsigned long long)err.offset, (unsigned long long)want_at,
			   err.message);
		FUZZ_CHECK(!strncmp(err.message, "F: digest table: ", 17), "%s", err.message);
		FUZZ_CHECK(err.field && !strcmp(err.field, "digests"), "field %s", err.field);
	} else {
		FUZZ_CHECK(d.entries == t + 64 && d.chunk_log2 == t[12] && d.from == le64(t + 24) &&
			       d.to == le64(t + 32) && d.file_size == le64(t + 16) &&
			       d.chunks == (len - 64) / 16,
			   "fields differ from the bytes");
		FUZZ_CHECK(kiln__digests_size(d.from, d.to, d.chunk_log2) == len, "size %zu", len);
		uint8_t *again = malloc(len);
		FUZZ_CHECK(again != NULL, "out of memory");
		memcpy(again, t, len);
		memset(again, 0xAB, 64);
		kiln__digests_seal(again, len, d.file_size, d.from, d.to, d.chunk_log2);
		FUZZ_CHECK(!memcmp(again, t, len), "sealing its fields gives other bytes");
		FUZZ_CHECK(!memcmp(d.self, t + 48, 16), "self digest");
		free(again);
	}
	free(t);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_digest(data, size);
}
#endif
