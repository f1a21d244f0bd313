/* SPDX-License-Identifier: MIT */
/*
 * Text helpers for klnt: a growable string, escaping of untrusted bytes for terminals, UTF-8
 * repair for JSON, and the number and shape spellings every command shares.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "klnt.h"

void *klnt_xrealloc(void *p, size_t size)
{
	void *q = realloc(p, size ? size : 1);
	if (!q) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	return q;
}

void *klnt_xmalloc(size_t size)
{
	return klnt_xrealloc(NULL, size);
}

static void buf_reserve(struct klnt_buf *b, size_t more)
{
	if (more < b->cap - b->len) /* room for the bytes and the NUL */
		return;
	size_t need = b->len + more + 1;
	if (need < b->len) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	size_t cap = b->cap ? b->cap : 64;
	while (cap < need)
		cap *= 2;
	b->p = klnt_xrealloc(b->p, cap);
	b->cap = cap;
}

void klnt_buf_put(struct klnt_buf *b, const void *s, size_t len)
{
	buf_reserve(b, len);
	memcpy(b->p + b->len, s, len);
	b->len += len;
	b->p[b->len] = '\0';
}

void klnt_buf_puts(struct klnt_buf *b, const char *s)
{
	klnt_buf_put(b, s, strlen(s));
}

void klnt_buf_printf(struct klnt_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	buf_reserve(b, (size_t)n);
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void klnt_buf_reset(struct klnt_buf *b)
{
	b->len = 0;
	if (b->p)
		b->p[0] = '\0';
}

void klnt_buf_free(struct klnt_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

/*
 * Decode one RFC 3629 code point at s[0..len). Returns its length (1-4) and sets *cp, or 0 when
 * the bytes are not well-formed (overlong, surrogate, above U+10FFFF, truncated, stray
 * continuation byte). Names in a valid file are already well-formed; paths and argv are not.
 */
static size_t utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
	unsigned char c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	size_t n;
	uint32_t v, min;
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2, v = c & 0x1F, min = 0x80;
	} else if (c >= 0xE0 && c <= 0xEF) {
		n = 3, v = c & 0x0F, min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4, v = c & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if (len < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3F);
	}
	if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
		return 0;
	*cp = v;
	return n;
}

/* Code points that are well-formed but would let a name rewrite or reorder what a terminal
 * shows: C1 controls (some terminals act on U+009B as CSI), bidirectional embeddings and
 * isolates ("Trojan Source"), and the Unicode line and paragraph separators. */
static int unsafe_code_point(uint32_t cp)
{
	return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
	       (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

void klnt_escape(struct klnt_buf *b, const char *s, size_t len, int quote)
{
	const unsigned char *u = (const unsigned char *)s;
	if (quote)
		klnt_buf_put(b, "\"", 1);
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t n = utf8_decode(u + i, len - i, &cp);
		if (n == 0) {
			klnt_buf_printf(b, "\\x%02x", u[i]);
			i++;
			continue;
		}
		if (cp == '\\' || (quote && cp == '"')) {
			klnt_buf_put(b, "\\", 1);
			klnt_buf_put(b, u + i, 1);
		} else if (cp == '\n') {
			klnt_buf_puts(b, "\\n");
		} else if (cp == '\t') {
			klnt_buf_puts(b, "\\t");
		} else if (cp == '\r') {
			klnt_buf_puts(b, "\\r");
		} else if (cp < 0x20 || cp == 0x7F) {
			klnt_buf_printf(b, "\\x%02x", (unsigned)cp);
		} else if (unsafe_code_point(cp)) {
			klnt_buf_printf(b, "\\u{%04" PRIX32 "}", cp);
		} else {
			klnt_buf_put(b, u + i, n);
		}
		i += n;
	}
	if (quote)
		klnt_buf_put(b, "\"", 1);
}

void klnt_fputs_escaped(FILE *f, const char *s)
{
	struct klnt_buf b = {0};
	klnt_escape(&b, s, strlen(s), 0);
	if (b.len)
		fputs(b.p, f);
	klnt_buf_free(&b);
}

void klnt_fputs_path(FILE *f, const char *path)
{
	char shown[4096];
	kiln_path_shown(path, shown, sizeof(shown));
	klnt_fputs_escaped(f, shown);
}

size_t klnt_text_width(const char *s, size_t len)
{
	size_t w = 0;
	for (size_t i = 0; i < len; i++)
		w += ((unsigned char)s[i] & 0xC0) != 0x80;
	return w;
}

char *klnt_utf8_sanitize(const char *s)
{
	static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */
	struct klnt_buf b = {0};
	const unsigned char *u = (const unsigned char *)s;
	size_t len = strlen(s);
	klnt_buf_put(&b, "", 0);
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t n = utf8_decode(u + i, len - i, &cp);
		if (n == 0) {
			klnt_buf_puts(&b, replacement);
			i++;
		} else {
			klnt_buf_put(&b, u + i, n);
			i += n;
		}
	}
	return b.p;
}

int klnt_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	/* strtoull would accept a sign, leading spaces and octal; a dimension or an index is
	 * plain decimal, so anything else is a typo worth refusing. */
	if (!*s)
		return -1;
	uint64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (v > max)
		return -1;
	*out = v;
	return 0;
}

int klnt_parse_size(const char *s, uint64_t *out)
{
	/* The digits as klnt_parse_u64 takes them (no sign, space or base: strtoull would turn
	 * "-1" into 2^64 - 1), then one suffix, the product checked. */
	size_t n = strspn(s, "0123456789");
	char digits[32];
	if (!n || n >= sizeof(digits))
		return -1;
	memcpy(digits, s, n);
	digits[n] = '\0';
	uint64_t v;
	if (klnt_parse_u64(digits, UINT64_MAX, &v))
		return -1;
	const char *end = s + n;
	unsigned shift = 0;
	if (*end) {
		const char *units = "KMGT", *u = strchr(units, toupper((unsigned char)*end));
		if (!u)
			return -1;
		shift = 10u * (unsigned)(u - units + 1);
		end++;
		if (strcmp(end, "") != 0 && strcmp(end, "iB") != 0 && strcmp(end, "B") != 0)
			return -1;
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -1;
	*out = v << shift;
	return 0;
}

void klnt_dtype_text(struct klnt_buf *b, unsigned dtype)
{
	const char *name = kiln_dtype_name(dtype);
	if (kiln_dtype_is_opaque(dtype))
		klnt_buf_printf(b, "opaque(%u)", dtype);
	else if (name)
		klnt_buf_puts(b, name);
	else
		klnt_buf_printf(b, "unknown(%u)", dtype);
}

void klnt_shape_text(struct klnt_buf *b, const uint64_t *shape, unsigned rank)
{
	klnt_buf_put(b, "[", 1);
	for (unsigned i = 0; i < rank; i++)
		klnt_buf_printf(b, "%s%" PRIu64, i ? ", " : "", shape[i]);
	klnt_buf_put(b, "]", 1);
}
