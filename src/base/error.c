/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "base/base.h"

const char *kiln_version(void)
{
	return KILN_VERSION_STRING;
}

unsigned kiln_version_number(void)
{
	return KILN_VERSION_NUMBER;
}

const char *kiln_code_name(int code)
{
	switch (code) {
#define KILN__NAME(name, value, short_name, text) \
	case value:                               \
		return short_name;
		KILN_CODES(KILN__NAME)
#undef KILN__NAME
	}
	return "UNKNOWN";
}

const char *kiln_strerror(int code)
{
	switch (code) {
#define KILN__TEXT(name, value, short_name, text) \
	case value:                               \
		return text;
		KILN_CODES(KILN__TEXT)
#undef KILN__TEXT
	}
	return "unknown error code";
}

int kiln_is_format_error(int code)
{
	return code == KILN_FRAME || code == KILN_TYPE || code == KILN_LIMIT || code == KILN_UTF8;
}

void kiln__clear_error(kiln_error *err)
{
	if (!err)
		return;
	memset(err, 0, sizeof(*err));
	err->tensor = KILN_NO_INDEX;
	err->file = KILN_NO_FILE;
	err->offset = KILN_NO_OFFSET;
}

/* A long prefix (a deep path) gives way to the reason after it: it keeps its head and its tail
 * (the file's name) with "..." between, so that "<path>: <why>" fits, the prefix no shorter
 * than PREFIX_MIN. What is still too long is cut where any message is: at sizeof(message) - 1. */
#define PREFIX_MIN  48
#define PREFIX_HEAD 12

void kiln__error_prefix(kiln_error *err, const char *prefix)
{
	if (!err)
		return;
	size_t room = sizeof(err->message) - 1, n = strlen(prefix), why = strlen(err->message);
	size_t keep = room > why + 2 + PREFIX_MIN ? room - why - 2 : PREFIX_MIN;
	char shortened[sizeof(err->message)];
	if (n > keep) {
		size_t tail = keep - PREFIX_HEAD - 3, from = n - tail;
		/* Not inside a UTF-8 character: forward over continuation bytes. */
		while (from < n && ((unsigned char)prefix[from] & 0xC0) == 0x80)
			from++;
		size_t head = PREFIX_HEAD;
		while (head > 0 && ((unsigned char)prefix[head] & 0xC0) == 0x80)
			head--;
		snprintf(shortened, sizeof(shortened), "%.*s...%s", (int)head, prefix,
			 prefix + from);
		prefix = shortened;
	}
	char msg[2 * sizeof(err->message)];
	snprintf(msg, sizeof(msg), "%s: %s", prefix, err->message);
	memcpy(err->message, msg, sizeof(err->message) - 1);
	err->message[sizeof(err->message) - 1] = '\0';
}

void kiln__error_named(kiln_error *err, const char *name)
{
	size_t n = strlen(name);
	if (err && name && !(strncmp(err->message, name, n) == 0 && err->message[n] == ':'))
		kiln__error_prefix(err, name);
}

void kiln__error_file(kiln_error *err, uint32_t file)
{
	if (err && err->code && err->file == KILN_NO_FILE)
		err->file = file;
}

/* Every failure is filled here: the code and where, then the message. */
static int vfail(kiln_error *err, int code, int sys_errno, uint64_t tensor, const char *field,
		 uint64_t offset, const char *fmt, va_list ap)
    __attribute__((format(printf, 7, 0)));

static int vfail(kiln_error *err, int code, int sys_errno, uint64_t tensor, const char *field,
		 uint64_t offset, const char *fmt, va_list ap)
{
	if (!err)
		return code;
	*err = (kiln_error){.code = code,
			    .sys_errno = sys_errno,
			    .tensor = tensor,
			    .file = KILN_NO_FILE,
			    .field = field,
			    .offset = offset};
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	return code;
}

int kiln__fail(kiln_error *err, int code, uint64_t tensor, const char *field, uint64_t offset,
	       const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, 0, tensor, field, offset, fmt, ap);
	va_end(ap);
	return code;
}

int kiln__fail_named(kiln_error *err, const char *name, int code, uint64_t tensor,
		     const char *field, uint64_t offset, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, 0, tensor, field, offset, fmt, ap);
	va_end(ap);
	kiln__error_prefix(err, name);
	return code;
}

int kiln__fail_desc(kiln_error *err, int code, uint64_t tensor, const char *field, uint64_t offset,
		    const char *fmt, ...)
{
	if (!err)
		return code;
	/* The prefixed message is cut where the unprefixed one would be: at sizeof(message) - 1. */
	char what[sizeof(err->message)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return kiln__fail(err, code, tensor, field, offset, "descriptor %" PRIu64 ": %s", tensor,
			  what);
}

int kiln__fail_sys(kiln_error *err, int code, int sys_errno, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, sys_errno, KILN_NO_INDEX, NULL, KILN_NO_OFFSET, fmt, ap);
	va_end(ap);
	return code;
}

int kiln_error_set(kiln_error *err, int code, int sys_errno, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, sys_errno, KILN_NO_INDEX, NULL, KILN_NO_OFFSET, fmt, ap);
	va_end(ap);
	return code;
}

int kiln__nomem(kiln_error *err, uint64_t bytes, const char *what)
{
	if (!what)
		return kiln__nomem(err, 0, NULL);
	if (!bytes)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory for %s", what);
	return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate %" PRIu64 " bytes for %s",
			      bytes, what);
}

int kiln__check_size(const char *type, uint32_t size, size_t known, kiln_error *err)
{
	if (size == 0 || size == known)
		return 0;
	return kiln__fail_inval(err, KILN_NO_INDEX, "size",
				"%s.size %" PRIu32
				" is not this version's %zu (or 0, which means it)",
				type, size, known);
}

int kiln_check_size(const char *type, uint32_t size, size_t known, kiln_error *err)
{
	kiln__clear_error(err);
	return kiln__check_size(type ? type : "options", size, known, err);
}
