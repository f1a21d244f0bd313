/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a model_signing statement or sigstore bundle (src/format/signing.h), what a
 * model.sig beside a model holds. The first byte picks the file name looked up (bit 0: "m" or
 * "."); bit 1 wraps the rest as a bundle's base64 payload, so that the fuzzer reaches the
 * statement behind the envelope.
 *
 * Judged by what any answer must be: a class the reader may give, located in the text, a message
 * naming the statement; accepted digests sorted, non-empty, non-overlapping ranges, a whole-file
 * digest alone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "format/signing.h"
#include "fuzz.h"

static char *bundle_of(const uint8_t *p, size_t n, size_t *len)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	static const char head[] =
	    "{\"dsseEnvelope\":{\"payloadType\":\"application/vnd.in-toto+json\",\"payload\":\"";
	static const char tail[] = "\"}}";
	char *o = malloc(sizeof(head) + (n + 2) / 3 * 4 + sizeof(tail));
	if (!o)
		return NULL;
	char *q = o + sizeof(head) - 1;
	memcpy(o, head, sizeof(head) - 1);
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
			     (i + 2 < n ? p[i + 2] : 0);
		*q++ = a[v >> 18 & 63];
		*q++ = a[v >> 12 & 63];
		*q++ = i + 1 < n ? a[v >> 6 & 63] : '=';
		*q++ = i + 2 < n ? a[v & 63] : '=';
	}
	memcpy(q, tail, sizeof(tail));
	*len = (size_t)(q - o) + sizeof(tail) - 1;
	return o;
}

int kiln_fuzz_signing(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *name = data[0] & 1 ? "." : "m";
	size_t len = size - 1;
	uint8_t *text;
	if (data[0] & 2) {
		text = (uint8_t *)bundle_of(data + 1, len, &len);
	} else {
		text = malloc(len ? len : 1);
		if (text)
			memcpy(text, data + 1, len);
	}
	if (!text)
		return 0;
	struct kiln__signed *d = (struct kiln__signed *)1;
	size_t n = 7;
	kiln_error err;
	int rc = kiln__signing_digests(text, len, "S", name, &d, &n, &err);
	if (rc) {
		FUZZ_CHECK(rc == KILN_FRAME || rc == KILN_TYPE || rc == KILN_UTF8 ||
			       rc == KILN_UNSUPPORTED || rc == KILN_LIMIT || rc == KILN_NOMEM,
			   "class %s: %s", kiln_code_name(rc), err.message);
		FUZZ_CHECK(d == NULL && n == 0, "a refusal handed out digests");
		FUZZ_CHECK(!strncmp(err.message, "S: ", 3), "%s", err.message);
		FUZZ_CHECK(err.field && !strcmp(err.field, "model_signing"), "field %s", err.field);
	} else {
		FUZZ_CHECK((n == 0) == (d == NULL), "%zu digests at %p", n, (void *)d);
		for (size_t i = 0; i < n; i++) {
			FUZZ_CHECK(d[i].from < d[i].to, "range %zu: %llu..%llu", i,
				   (unsigned long long)d[i].from, (unsigned long long)d[i].to);
			FUZZ_CHECK(d[i].to != UINT64_MAX || (d[i].from == 0 && n == 1),
				   "a whole-file digest among %zu", n);
			FUZZ_CHECK(i == 0 || d[i].from >= d[i - 1].to, "ranges %zu and %zu overlap",
				   i - 1, i);
		}
		free(d);
	}
	free(text);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_signing(data, size);
}
#endif
