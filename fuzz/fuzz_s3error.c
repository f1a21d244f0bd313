/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the body of an error answer, as an S3-compatible server (or anyone pretending to
 * be one) sends it, through kiln__xml_field, which pulls the <Code> and <Message> that kiln's
 * error messages quote. The input is the body (up to its first NUL, as the transfer keeps it).
 *
 * Judged, besides the sanitizers: each field is NUL-terminated within its buffer, holds only
 * printable bytes, and is exactly the bytes between the first <TAG> and the first </TAG> after
 * it (unprintable ones as '?'), cut to fit; "" when the body has no such pair.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <string.h>

#include "fuzz.h"
#include "net/net.h"

static void check_field(const char *body, const char *tag, size_t cap)
{
	char out[128];
	memset(out, 0x7f, sizeof(out));
	kiln__xml_field(body, tag, out, cap);
	size_t n = strnlen(out, cap);
	FUZZ_CHECK(n < cap, "<%s>: not terminated within its %zu bytes", tag, cap);
	FUZZ_CHECK(out[cap] == 0x7f || cap == sizeof(out), "<%s>: wrote past its buffer", tag);
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(isprint((unsigned char)out[i]), "<%s>: byte %zu is unprintable", tag, i);
	char open[40], close[40];
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	const char *a = strstr(body, open), *b = a ? strstr(a, close) : NULL;
	if (!b) {
		FUZZ_CHECK(n == 0, "<%s>: a value without an element: %s", tag, out);
		return;
	}
	a += strlen(open);
	size_t want = (size_t)(b - a) < cap - 1 ? (size_t)(b - a) : cap - 1;
	FUZZ_CHECK(n == want, "<%s>: %zu bytes, not %zu", tag, n, want);
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(out[i] == (isprint((unsigned char)a[i]) ? a[i] : '?'),
			   "<%s>: byte %zu differs", tag, i);
}

int kiln_fuzz_s3error(const uint8_t *data, size_t size)
{
	char *body = kiln__fuzz_cstr(data, size);
	if (!body)
		return 0;
	check_field(body, "Code", 64);
	check_field(body, "Message", 96);
	check_field(body, "Code", 1); /* room for the NUL alone */
	free(body);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_s3error(data, size);
}
#endif
