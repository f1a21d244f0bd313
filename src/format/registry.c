/* SPDX-License-Identifier: MIT */
/*
 * The formats kiln reads, and how a file's format is told: the one the caller named, the one its
 * first bytes say, or the one its name says (the resolver read the name: f->named_format).
 */
#include <string.h>

#include "format/format.h"

static const struct kiln__format *const formats[] = {
    [KILN_FORMAT_KLNT] = &kiln__format_klnt,
    [KILN_FORMAT_GGUF] = &kiln__format_gguf,
    [KILN_FORMAT_SAFETENSORS] = &kiln__format_safetensors,
};

const struct kiln__format *kiln__format_by_id(unsigned id)
{
	return id < sizeof(formats) / sizeof(formats[0]) ? formats[id] : NULL;
}

const struct kiln__format *kiln__format_sniff(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		if (formats[i] && formats[i]->sniff(p, len))
			return formats[i];
	return NULL;
}

const char *kiln_format_name(unsigned format)
{
	static const char *const names[] = {"auto", "klnt", "gguf", "safetensors"};
	return format < sizeof(names) / sizeof(names[0]) ? names[format] : NULL;
}

int kiln__format_of(struct kiln__file *f, unsigned want, const struct kiln__format **out,
		    kiln_error *err)
{
	uint64_t n = f->size < KILN__FIRST_BYTES ? f->size : KILN__FIRST_BYTES;
	const uint8_t *p = NULL;
	int rc = n ? kiln__fetch(f, 0, n, 0, &p, err) : 0;
	if (rc)
		return rc;
	const struct kiln__format *fmt = n ? kiln__format_sniff(p, (size_t)n) : NULL;
	if (want) {
		/* Insisting on a format: a file that is plainly another is refused as what it
		 * is; one like none goes to the wanted reader, which says what is wrong. */
		const struct kiln__format *w = kiln__format_by_id(want);
		if (fmt && fmt != w)
			return kiln__fail(err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
					  "a %s file, not %s (the format asked for)", fmt->name,
					  w->name);
		*out = w;
		return 0;
	}
	/* Bytes that start like no format, in a file named for one: that format's reader names the
	 * defect in its own terms. */
	if (!fmt && f->named_format)
		fmt = kiln__format_by_id(f->named_format);
	/* Bytes that start like no format at all: KLNT's verdict, in its check order (length
	 * first: under 64 bytes LIMIT, as the spec's check 1 says), then its magic (FRAME, naming
	 * the other formats too). */
	if (!fmt && n >= KILN__FIRST_BYTES)
		return kiln__fail(
		    err, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
		    "magic is %02x %02x %02x %02x, not \"KLNT\"; not a safetensors or "
		    "GGUF file either",
		    p[0], p[1], p[2], p[3]);
	*out = fmt ? fmt : &kiln__format_klnt;
	return 0;
}
