/* SPDX-License-Identifier: MIT */
/*
 * Internal interface of the klnt command-line tool: the command table entry each command file
 * exports, and the helpers they share. klnt uses only the public kiln API.
 */
#ifndef KLNT_H
#define KLNT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "kiln/kiln.h"
#include "kiln/toolkit.h"

/* Exit statuses; `klnt --help` documents them and scripts rely on them. */
enum klnt_exit {
	KLNT_EXIT_OK = 0,
	KLNT_EXIT_INVALID = 1, /* a file or input was rejected: format error, no such tensor, ... */
	KLNT_EXIT_USAGE = 2,   /* bad command line */
	KLNT_EXIT_IO = 3,      /* a file could not be read or written, or memory ran out */
	KLNT_EXIT_SIGNAL = 128 /* plus the signal: interrupted by SIGINT (130) or SIGTERM (143) */
};

struct klnt_cmd {
	const char *name;
	const char *summary; /* one line for `klnt --help` */
	const char *usage;   /* full text for `klnt CMD --help` */
	const char *usage2;  /* and its rest, where one string would pass C's 4095 bytes; or NULL */
	/* argv[0] is the command name, as getopt_long expects a program name there. */
	int (*run)(const struct klnt_cmd *cmd, int argc, char **argv);
};

extern const struct klnt_cmd klnt_cmd_check;
extern const struct klnt_cmd klnt_cmd_inspect;
extern const struct klnt_cmd klnt_cmd_cat;
extern const struct klnt_cmd klnt_cmd_pack;
extern const struct klnt_cmd klnt_cmd_gen;
extern const struct klnt_cmd klnt_cmd_bench;
extern const struct klnt_cmd klnt_cmd_import;
extern const struct klnt_cmd klnt_cmd_export;
extern const struct klnt_cmd klnt_cmd_load;
extern const struct klnt_cmd klnt_cmd_digest;
extern const struct klnt_cmd klnt_cmd_verify;

/* --- command-line handling (klnt.c) ------------------------------------------------------ */

/* Print "klnt CMD: <message>" and the --help hint to stderr; returns KLNT_EXIT_USAGE. */
int klnt_usage_error(const struct klnt_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Report the option getopt_long just refused (it returned c, '?' or ':'); returns
 * KLNT_EXIT_USAGE. Needs opterr = 0 and an optstring starting with ':'. */
int klnt_bad_option(const struct klnt_cmd *cmd, int c, char **argv);

/* Print the command's usage text to stdout; returns KLNT_EXIT_OK. */
int klnt_help(const struct klnt_cmd *cmd);

/* --- reporting kiln errors (klnt.c) -------------------------------------------------------- */

/* The class printed for a kiln code: its short name (FRAME, TYPE, LIMIT, UTF8, INVAL,
 * NOTFOUND, UNSUPPORTED, IO, NOMEM, ...). */
const char *klnt_class(int code);

/* KLNT_EXIT_INVALID for an input that was rejected (a format error, INVAL, NOTFOUND,
 * UNSUPPORTED), KLNT_EXIT_IO for any other failure (IO, NOMEM, ...). */
int klnt_exit_for(int code);

/* Print "FILE: CLASS: message" (escaped, one line) to f. */
void klnt_report(FILE *f, const char *file, int code, const kiln_error *err);

/* Print "klnt CMD: <message>" to stderr. Callers name the file in the message. */
void klnt_errorf(const struct klnt_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* fflush(stdout), remembering the errno of the first failure for the final report. Returns 0
 * or an errno value. */
int klnt_flush_stdout(void);

/* Write all of buf to stdout's descriptor, retrying partial writes and EINTR. Returns 0 or an
 * errno value. Flushes the stdio buffer first so output stays in order. */
int klnt_write_stdout(const void *buf, size_t len);

/* --- interruption (klnt.c) --------------------------------------------------------------- */

/*
 * From now on the first SIGINT or SIGTERM only sets a flag, so that a command writing a file can
 * stop at its next payload chunk and let kiln remove the temporary file; a second one ends the
 * process at once. A signal that was ignored when klnt started (a background job of a
 * non-interactive shell ignores SIGINT) stays ignored.
 */
void klnt_catch_signals(void);

/* The signal caught since klnt_catch_signals(), or 0. Cheap enough for every payload chunk. */
int klnt_caught_signal(void);

/* For a command that was writing `out` when signal sig arrived: print one line saying whether
 * `out` was written (`written`) or left as it was, and return KLNT_EXIT_SIGNAL + sig. */
int klnt_interrupted(const struct klnt_cmd *cmd, const char *out, int sig, int written);

/* --- converting (cmd_import.c, shared by import and export) ------------------------------ */

/* The progress line on a terminal (stderr) and the signal check, as a kiln_convert_progress_fn
 * with a struct klnt_progress as its context. */
struct klnt_progress {
	const struct klnt_cmd *cmd;
	int tty, shown;
	struct timespec start, last;
};
int klnt_convert_progress(void *ctx, uint64_t done, uint64_t total);

/* After kiln_import/kiln_export returned rc: clear the progress line, report an interruption
 * or an error ("FILE: CLASS: message", FILE the input the message is about, else out), and
 * return the exit status. */
int klnt_convert_finish(struct klnt_progress *p, const char *out, const char *const *files,
			int nfiles, int rc, const kiln_error *err);

/* --- text (text.c) ------------------------------------------------------------------------- */

/* A growable byte string, always NUL-terminated. Allocation failure exits with KLNT_EXIT_IO:
 * a command-line tool has nothing better to do with it. */
struct klnt_buf {
	char *p;
	size_t len;
	size_t cap;
};

void klnt_buf_put(struct klnt_buf *b, const void *s, size_t len);
void klnt_buf_puts(struct klnt_buf *b, const char *s);
void klnt_buf_printf(struct klnt_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void klnt_buf_reset(struct klnt_buf *b);
void klnt_buf_free(struct klnt_buf *b);

/*
 * Append s[0..len) made safe for a terminal: backslash, control characters (C0, DEL, C1),
 * bidirectional overrides and line separators are escaped (\\, \n, \t, \r, \xNN, \u{NNNN});
 * bytes that are not well-formed UTF-8 become \xNN; other UTF-8 passes through. With `quote`,
 * the result is wrapped in double quotes and '"' is escaped too.
 */
void klnt_escape(struct klnt_buf *b, const char *s, size_t len, int quote);

/* fputs() of a NUL-terminated string through klnt_escape() without quotes. */
void klnt_fputs_escaped(FILE *f, const char *s);
/* The options for URLs the command line gave (klnt --timeout), or NULL: every open uses them. */
const kiln_remote_options *klnt_remote(void);
/* When a URL's cache directory was refused (not private), say why on stderr. */
void klnt_note_cache(const kiln_model *m);
/* A model's path or URL, as kiln's messages show it (a URL's credentials left out), escaped. */
void klnt_fputs_path(FILE *f, const char *path);

/* Terminal columns of escaped text, counting one per code point (wide CJK is rare in tensor
 * names and not worth a locale dependency). */
size_t klnt_text_width(const char *s, size_t len);

/* A copy of s with every byte that is not well-formed UTF-8 replaced by U+FFFD, for JSON. */
char *klnt_utf8_sanitize(const char *s);

/* Parse a decimal number without sign, spaces or trailing text, at most max. Returns 0 or -1. */
int klnt_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* A byte count with an optional suffix K, M, G, T (powers of 1024; KiB, KB... accepted too).
 * Returns 0 or -1. */
int klnt_parse_size(const char *s, uint64_t *out);

/* "f32", or "opaque(4096)" for an opaque code. */
void klnt_dtype_text(struct klnt_buf *b, unsigned dtype);

/* "[2, 3]"; "[]" for rank 0. */
void klnt_shape_text(struct klnt_buf *b, const uint64_t *shape, unsigned rank);

/* Exit with a message when memory runs out. */
void *klnt_xmalloc(size_t size);

/* klnt bench on URLs (cmd_bench_remote.c): the remote rows, printed; an exit status. */
int klnt_bench_remote(const char *const *urls, uint32_t n, uint64_t repeat, uint32_t connections);
void *klnt_xrealloc(void *p, size_t size);

#endif
