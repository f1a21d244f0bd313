/* SPDX-License-Identifier: MIT */
/*
 * Formats: a reader per format, each producing the same index of views. A reader is pure: it
 * asks for byte ranges of its file through kiln__fetch / kiln__prefix (the file's source reads
 * them), checks them in one pass, and adds its tensors to the model's index once their count is
 * proven to fit in the bytes: it does no I/O of its own and never looks at payload memory. It
 * sets the file's payload_base (what open reads: [0, payload_base)), version and alignment, and
 * each view's file and byte offsets; the lifecycle binds data pointers afterwards. Errors are one
 * of the four classes with the tensor's position in the file, the field and the byte offset.
 */
#ifndef KILN_FORMAT_FORMAT_H
#define KILN_FORMAT_FORMAT_H

#include "index/index.h"

struct kiln__format {
	unsigned id;      /* enum kiln_format */
	const char *name; /* "klnt", ... */
	/* Nonzero when the file's first bytes (len of them, up to 64) look like this format. */
	int (*sniff)(const uint8_t *p, size_t len);
	/* Validate file f and add its tensors to f->model: f->first is the model index of its
	 * first tensor; the reader sets f->count. `exact`: the file must be exactly its content
	 * (KLNT: no trailing bytes). */
	int (*read)(struct kiln__file *f, int exact, kiln_error *err);
	/* Payload verification over an open file; NULL when the format has nothing to verify. */
	int (*verify)(const struct kiln__file *f, kiln_error *err);
	/* Every file is open: rules across the files (GGUF's split.tensors.count). NULL: none. */
	int (*done)(struct kiln_model *m, kiln_error *err);
};

extern const struct kiln__format kiln__format_klnt;
extern const struct kiln__format kiln__format_safetensors;
extern const struct kiln__format kiln__format_gguf;

/* The format whose sniff accepts the first bytes p[0, len); NULL when none does. */
const struct kiln__format *kiln__format_sniff(const uint8_t *p, size_t len);
/* The reader of format `id`, or NULL. */
const struct kiln__format *kiln__format_by_id(unsigned id);
/* The reader for file f (attached): the format `want` when not AUTO (FRAME when the file is
 * plainly another), else the one its first bytes say, else the one its name says; a file like
 * none is FRAME naming the magic it has. */
int kiln__format_of(struct kiln__file *f, unsigned want, const struct kiln__format **out,
		    kiln_error *err);

#endif
