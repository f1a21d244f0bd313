/* SPDX-License-Identifier: MIT */
/*
 * A strict JSON reader (RFC 8259) for the JSON inside formats: safetensors headers, their index
 * files and KLNT's metadata document. It pulls values from text already checked to be UTF-8,
 * allocates nothing, and says where every defect is (a byte offset into the text). What it
 * accepts is RFC 8259 exactly: no comments, no single quotes, no trailing commas, no control
 * characters in strings, no lone surrogates, no leading zeros, nothing but whitespace after the
 * value.
 *
 * Why not a library: json-c (the packaged one) keeps the last of duplicate keys silently, cuts a
 * key at an escaped U+0000, builds a tree of allocations per value before anything can be
 * checked, and reports no offset for what it rejects; a format reader needs each of those.
 */
#ifndef KILN_BASE_JSON_H
#define KILN_BASE_JSON_H

#include "base/base.h"

enum kiln__json_kind {
	KILN__JSON_END = 0, /* no more members or items */
	KILN__JSON_OBJECT,
	KILN__JSON_ARRAY,
	KILN__JSON_STRING,
	KILN__JSON_NUMBER,
	KILN__JSON_TRUE,
	KILN__JSON_FALSE,
	KILN__JSON_NULL
};

struct kiln__json {
	const uint8_t *s; /* the text */
	size_t len, pos;
	uint32_t depth, max_depth;
	/* The defect found, or 0: its class (FRAME for syntax, UTF8 for an escape that is not a
	 * character, LIMIT for nesting), offset in the text and what. */
	int code;
	size_t at;
	const char *what;
};

/* A string token: its bytes between the quotes, as written (escapes undecoded). */
struct kiln__json_str {
	const uint8_t *raw;
	size_t raw_len;
	size_t at;   /* offset of its opening quote */
	int escaped; /* it holds escapes: kiln__json_decode gives its value */
};

void kiln__json_init(struct kiln__json *j, const void *text, size_t len, uint32_t max_depth);

/* The kind of the next value, after whitespace, without consuming it; KILN__JSON_END (with
 * j->code set) at a defect or the end of the text. */
int kiln__json_peek(struct kiln__json *j);

/* Objects: kiln__json_enter consumes '{' (or '['); kiln__json_member then gives each key in turn
 * (consuming the ':' after it) and returns 1, or 0 at the closing '}' (or on a defect: check
 * j->code); after each key the caller consumes its value. Arrays: kiln__json_item returns 1 when
 * another item follows (the caller consumes it), 0 at ']'. */
int kiln__json_enter(struct kiln__json *j, int kind);
int kiln__json_member(struct kiln__json *j, struct kiln__json_str *key);
int kiln__json_item(struct kiln__json *j);

/* A string value (0), or a defect. */
int kiln__json_string(struct kiln__json *j, struct kiln__json_str *out);

/* A number token: 0, with *start and *n its text, or a defect. */
int kiln__json_number(struct kiln__json *j, size_t *start, size_t *n);

/* true, false, null: 0 or a defect. */
int kiln__json_literal(struct kiln__json *j);

/* Skip one value of any kind, nested ones included (depth bounded). */
int kiln__json_skip(struct kiln__json *j);

/* After the value: only whitespace may follow. 0 or FRAME. */
int kiln__json_finish(struct kiln__json *j);

/* Decode string s into dst (at least s->raw_len bytes: decoding never lengthens); returns the
 * decoded length. The string was checked when it was read. */
size_t kiln__json_decode(const struct kiln__json_str *s, uint8_t *dst);

/* The decoded string equals the `n` bytes of `want`. */
int kiln__json_str_is(const struct kiln__json_str *s, const char *want, size_t n);

/* A number token that is a non-negative integer below 2^64 (digits only): 0 and *v; 1 when it
 * is not an integer (a sign, fraction or exponent); 2 when it does not fit 64 bits. */
int kiln__json_u64(const uint8_t *num, size_t n, uint64_t *v);

#endif
