/* SPDX-License-Identifier: MIT */
/* The strict JSON reader of src/base/json.h: a cursor over the text, one token at a time. */
#include "base/json.h"

static int fail(struct kiln__json *j, int code, size_t at, const char *what)
{
	if (!j->code) {
		j->code = code;
		j->at = at;
		j->what = what;
	}
	return code;
}

void kiln__json_init(struct kiln__json *j, const void *text, size_t len, uint32_t max_depth)
{
	*j = (struct kiln__json){.s = text, .len = len, .max_depth = max_depth};
}

static void skip_ws(struct kiln__json *j)
{
	const uint8_t *s = j->s;
	size_t p = j->pos, n = j->len;
	while (p < n && (s[p] == ' ' || s[p] == '\n' || s[p] == '\r' || s[p] == '\t'))
		p++;
	j->pos = p;
}

int kiln__json_peek(struct kiln__json *j)
{
	if (j->code)
		return KILN__JSON_END;
	skip_ws(j);
	if (j->pos >= j->len) {
		fail(j, KILN_FRAME, j->pos, "the text ends where a value should be");
		return KILN__JSON_END;
	}
	switch (j->s[j->pos]) {
	case '{':
		return KILN__JSON_OBJECT;
	case '[':
		return KILN__JSON_ARRAY;
	case '"':
		return KILN__JSON_STRING;
	case 't':
		return KILN__JSON_TRUE;
	case 'f':
		return KILN__JSON_FALSE;
	case 'n':
		return KILN__JSON_NULL;
	default: {
		uint8_t c = j->s[j->pos];
		if (c == '-' || (c >= '0' && c <= '9'))
			return KILN__JSON_NUMBER;
		fail(j, KILN_FRAME, j->pos, "not the start of a JSON value");
		return KILN__JSON_END;
	}
	}
}

/* Consume `c` after whitespace, or fail with `what`. */
static int expect(struct kiln__json *j, uint8_t c, const char *what)
{
	skip_ws(j);
	if (j->pos < j->len && j->s[j->pos] == c) {
		j->pos++;
		return 0;
	}
	return fail(j, KILN_FRAME, j->pos, what);
}

int kiln__json_enter(struct kiln__json *j, int kind)
{
	if (j->code)
		return j->code;
	if (++j->depth > j->max_depth)
		return fail(j, KILN_LIMIT, j->pos, "JSON nested deeper than this reader allows");
	return expect(j, kind == KILN__JSON_OBJECT ? '{' : '[',
		      kind == KILN__JSON_OBJECT ? "not a JSON object" : "not a JSON array");
}

static int hex4(const uint8_t *p, unsigned *v)
{
	unsigned x = 0;
	for (int k = 0; k < 4; k++) {
		int d = kiln__hex_digit(p[k]);
		if (d < 0)
			return -1;
		x = x << 4 | (unsigned)d;
	}
	*v = x;
	return 0;
}

/* The string at the cursor (its opening quote), checked: escapes well formed, surrogates paired,
 * no control characters. The text is UTF-8 already. */
static int scan_string(struct kiln__json *j, struct kiln__json_str *out)
{
	const uint8_t *s = j->s;
	size_t n = j->len, p = j->pos + 1, start = p;
	int escaped = 0;
	for (;;) {
		/* Most of a name is plain bytes: run over them. */
		while (p < n && s[p] != '"' && s[p] != '\\' && s[p] >= 0x20)
			p++;
		if (p >= n)
			return fail(j, KILN_FRAME, j->pos, "a string that does not end");
		uint8_t c = s[p];
		if (c == '"')
			break;
		if (c < 0x20)
			return fail(j, KILN_FRAME, p, "a control character inside a string");
		escaped = 1;
		if (p + 1 >= n)
			return fail(j, KILN_FRAME, p, "a string that does not end");
		switch (s[p + 1]) {
		case '"':
		case '\\':
		case '/':
		case 'b':
		case 'f':
		case 'n':
		case 'r':
		case 't':
			p += 2;
			continue;
		case 'u':
			break;
		default:
			return fail(j, KILN_FRAME, p, "an unknown escape in a string");
		}
		unsigned cp;
		if (p + 6 > n || hex4(s + p + 2, &cp))
			return fail(j, KILN_FRAME, p, "a \\u escape without four hex digits");
		if (cp >= 0xDC00 && cp <= 0xDFFF)
			return fail(j, KILN_UTF8, p, "a lone low surrogate escape in a string");
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			unsigned lo;
			if (p + 12 > n || s[p + 6] != '\\' || s[p + 7] != 'u' ||
			    hex4(s + p + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
				return fail(j, KILN_UTF8, p,
					    "a high surrogate escape without its low half");
			p += 6;
		}
		p += 6;
	}
	out->raw = s + start;
	out->raw_len = p - start;
	out->at = j->pos;
	out->escaped = escaped;
	j->pos = p + 1;
	return 0;
}

int kiln__json_string(struct kiln__json *j, struct kiln__json_str *out)
{
	if (j->code)
		return j->code;
	skip_ws(j);
	if (j->pos >= j->len || j->s[j->pos] != '"')
		return fail(j, KILN_FRAME, j->pos, "not a JSON string");
	return scan_string(j, out);
}

/* A closing `close` (0, the container ends) or a comma (1, another entry follows) after the
 * first entry; before it (`first`), the close or nothing (1). */
static int next_entry(struct kiln__json *j, uint8_t close, int *first)
{
	skip_ws(j);
	if (j->pos >= j->len) {
		fail(j, KILN_FRAME, j->pos, "the text ends inside an object or array");
		return 0;
	}
	uint8_t c = j->s[j->pos];
	if (c == close) {
		j->pos++;
		j->depth--;
		return 0;
	}
	if (!*first) {
		if (c != ',') {
			fail(j, KILN_FRAME, j->pos,
			     close == '}' ? "expected ',' or '}' after a member"
					  : "expected ',' or ']' after an item");
			return 0;
		}
		j->pos++;
		skip_ws(j);
		if (j->pos < j->len && j->s[j->pos] == close) {
			fail(j, KILN_FRAME, j->pos, "a trailing comma");
			return 0;
		}
	}
	*first = 0;
	return 1;
}

int kiln__json_member(struct kiln__json *j, struct kiln__json_str *key)
{
	if (j->code)
		return 0;
	/* Whether this is the object's first member: the byte before the cursor is its '{'
	 * (after whitespace) exactly when nothing has been read in it yet. */
	size_t b = j->pos;
	while (b > 0 && (j->s[b - 1] == ' ' || j->s[b - 1] == '\n' || j->s[b - 1] == '\r' ||
			 j->s[b - 1] == '\t'))
		b--;
	int first = b > 0 && j->s[b - 1] == '{';
	if (!next_entry(j, '}', &first))
		return 0;
	skip_ws(j);
	if (j->pos >= j->len || j->s[j->pos] != '"') {
		fail(j, KILN_FRAME, j->pos, "an object key that is not a string");
		return 0;
	}
	if (scan_string(j, key) || expect(j, ':', "expected ':' after an object key"))
		return 0;
	return 1;
}

int kiln__json_item(struct kiln__json *j)
{
	if (j->code)
		return 0;
	size_t b = j->pos;
	while (b > 0 && (j->s[b - 1] == ' ' || j->s[b - 1] == '\n' || j->s[b - 1] == '\r' ||
			 j->s[b - 1] == '\t'))
		b--;
	int first = b > 0 && j->s[b - 1] == '[';
	return next_entry(j, ']', &first);
}

int kiln__json_number(struct kiln__json *j, size_t *start, size_t *len)
{
	if (j->code)
		return j->code;
	skip_ws(j);
	const uint8_t *s = j->s;
	size_t n = j->len, p = j->pos, b = p;
	if (p < n && s[p] == '-')
		p++;
	if (p >= n || s[p] < '0' || s[p] > '9')
		return fail(j, KILN_FRAME, b, "a number without digits");
	if (s[p] == '0') {
		p++;
		if (p < n && s[p] >= '0' && s[p] <= '9')
			return fail(j, KILN_FRAME, b, "a number with a leading zero");
	} else {
		while (p < n && s[p] >= '0' && s[p] <= '9')
			p++;
	}
	if (p < n && s[p] == '.') {
		p++;
		if (p >= n || s[p] < '0' || s[p] > '9')
			return fail(j, KILN_FRAME, b, "a number with no digit after its '.'");
		while (p < n && s[p] >= '0' && s[p] <= '9')
			p++;
	}
	if (p < n && (s[p] == 'e' || s[p] == 'E')) {
		p++;
		if (p < n && (s[p] == '+' || s[p] == '-'))
			p++;
		if (p >= n || s[p] < '0' || s[p] > '9')
			return fail(j, KILN_FRAME, b, "a number with no digit in its exponent");
		while (p < n && s[p] >= '0' && s[p] <= '9')
			p++;
	}
	*start = b;
	*len = p - b;
	j->pos = p;
	return 0;
}

int kiln__json_literal(struct kiln__json *j)
{
	if (j->code)
		return j->code;
	skip_ws(j);
	static const char *const words[] = {"true", "false", "null"};
	for (int k = 0; k < 3; k++) {
		size_t w = strlen(words[k]);
		if (j->len - j->pos >= w && memcmp(j->s + j->pos, words[k], w) == 0) {
			j->pos += w;
			return 0;
		}
	}
	return fail(j, KILN_FRAME, j->pos, "not a JSON value");
}

int kiln__json_skip(struct kiln__json *j)
{
	struct kiln__json_str s;
	size_t a, b;
	switch (kiln__json_peek(j)) {
	case KILN__JSON_OBJECT:
		if (kiln__json_enter(j, KILN__JSON_OBJECT))
			return j->code;
		while (kiln__json_member(j, &s))
			if (kiln__json_skip(j))
				return j->code;
		return j->code;
	case KILN__JSON_ARRAY:
		if (kiln__json_enter(j, KILN__JSON_ARRAY))
			return j->code;
		while (kiln__json_item(j))
			if (kiln__json_skip(j))
				return j->code;
		return j->code;
	case KILN__JSON_STRING:
		return kiln__json_string(j, &s);
	case KILN__JSON_NUMBER:
		return kiln__json_number(j, &a, &b);
	case KILN__JSON_END:
		return j->code;
	default:
		return kiln__json_literal(j);
	}
}

int kiln__json_finish(struct kiln__json *j)
{
	if (j->code)
		return j->code;
	skip_ws(j);
	if (j->pos != j->len)
		return fail(j, KILN_FRAME, j->pos, "bytes after the JSON value");
	return 0;
}

/* UTF-8 of code point cp into d; its length. */
static size_t put_utf8(uint8_t *d, unsigned cp)
{
	if (cp < 0x80) {
		d[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		d[0] = (uint8_t)(0xC0 | cp >> 6);
		d[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		d[0] = (uint8_t)(0xE0 | cp >> 12);
		d[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
		d[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	d[0] = (uint8_t)(0xF0 | cp >> 18);
	d[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
	d[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
	d[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

size_t kiln__json_decode(const struct kiln__json_str *str, uint8_t *dst)
{
	const uint8_t *s = str->raw;
	size_t n = str->raw_len, o = 0;
	if (!str->escaped) {
		memcpy(dst, s, n);
		return n;
	}
	for (size_t p = 0; p < n;) {
		if (s[p] != '\\') {
			dst[o++] = s[p++];
			continue;
		}
		uint8_t e = s[p + 1];
		static const uint8_t simple[][2] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},
						    {'b', '\b'}, {'f', '\f'},  {'n', '\n'},
						    {'r', '\r'}, {'t', '\t'}};
		int done = 0;
		for (size_t k = 0; k < sizeof(simple) / sizeof(simple[0]); k++)
			if (simple[k][0] == e) {
				dst[o++] = simple[k][1];
				p += 2;
				done = 1;
				break;
			}
		if (done)
			continue;
		unsigned cp, lo;
		hex4(s + p + 2, &cp);
		p += 6;
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			hex4(s + p + 2, &lo);
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			p += 6;
		}
		/* \uXXXX takes 6 bytes for at most 3 of UTF-8, a pair 12 for 4: never longer. */
		o += put_utf8(dst + o, cp);
	}
	return o;
}

int kiln__json_str_is(const struct kiln__json_str *s, const char *want, size_t n)
{
	if (!s->escaped)
		return s->raw_len == n && memcmp(s->raw, want, n) == 0;
	if (s->raw_len < n || s->raw_len > 6 * n)
		return 0;
	/* Decoding never lengthens, and an escape spells one byte in at most 6: a spelling of
	 * the (short) keys compared against fits. */
	uint8_t buf[256];
	if (s->raw_len > sizeof(buf))
		return 0; /* decodes to more than 42 bytes: longer than any key compared */
	return kiln__json_decode(s, buf) == n && memcmp(buf, want, n) == 0;
}

int kiln__json_u64(const uint8_t *num, size_t n, uint64_t *v)
{
	uint64_t x = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = num[i];
		if (c < '0' || c > '9')
			return 1;
		if (x > (UINT64_MAX - (c - '0')) / 10)
			return 2;
		x = x * 10 + (c - '0');
	}
	*v = x;
	return 0;
}
