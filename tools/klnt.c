/* SPDX-License-Identifier: MIT */
/*
 * klnt: the command-line tool over the public kiln API. This file holds the command table, the
 * top-level options and the error and usage conventions every command follows:
 *
 * - errors about a file are one line that starts with the file: "FILE: CLASS: message";
 * - usage errors are "klnt CMD: problem" plus a hint, with exit status 2;
 * - every byte that came from a file or the command line is escaped before it reaches a
 *   terminal, so a hostile name cannot move the cursor or forge a line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "klnt.h"

static const struct klnt_cmd *const commands[] = {
    &klnt_cmd_check, &klnt_cmd_inspect, &klnt_cmd_cat,    &klnt_cmd_pack,
    &klnt_cmd_gen,   &klnt_cmd_import,  &klnt_cmd_export, &klnt_cmd_bench,
    &klnt_cmd_load,  &klnt_cmd_digest,  &klnt_cmd_verify,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char main_usage_head[] =
    "usage: klnt [--timeout SECONDS] COMMAND [OPTION]... [ARG]...\n"
    "       klnt --help | --version | help [COMMAND]\n"
    "\n"
    "Validate, inspect, extract, build and convert KLNT v2 tensor "
    "files.\n"
    "\n"
    "Commands:\n";

static const char main_usage_tail[] =
    "  help      show this text, or a command's with 'klnt help COMMAND'\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help and exit\n"
    "  -V, --version  print the version of the kiln library and exit\n"
    "  --timeout SECONDS\n"
    "                 for URLs: each operation (opening one file, fetching its payload, one\n"
    "                 read) fails with IO (ETIMEDOUT) once it has run this long, retries\n"
    "                 included (kiln_remote_options.deadline_ms). Without it, a request\n"
    "                 that receives nothing for 30 s, or that averages under 64 KiB/s past\n"
    "                 them, is retried, at most 6 times\n"
    "\n"
    "Run 'klnt COMMAND --help' for the arguments and options of a command.\n"
    "\n"
    "Errors about a file are one line, \"FILE: CLASS: message\", on stderr (for check, on\n"
    "stdout with the other verdicts). CLASS is FRAME, TYPE, LIMIT or UTF8 for bytes a KLNT v2\n"
    "reader must reject, IO when the file could not be opened, read or written, and NOTFOUND,\n"
    "INVAL or UNSUPPORTED for an input the command cannot take. Control\n"
    "characters and other unsafe bytes from files and arguments are printed escaped (\\n,\n"
    "\\t, \\\\, \\xNN, \\u{NNNN}).\n"
    "\n"
    "Exit status:\n"
    "  0  success (for check: every file is valid)\n"
    "  1  a file or an input was rejected: a format error (FRAME, TYPE, LIMIT, UTF8), no such\n"
    "     tensor (NOTFOUND), an input the command cannot take (INVAL, UNSUPPORTED: a tensor\n"
    "     the export target cannot express), or a raw file whose size does not match its\n"
    "     dtype and shape\n"
    "  2  usage error: unknown command or option, missing or malformed argument\n"
    "  3  a file could not be opened, read or written (IO), or memory ran out;\n"
    "     for check, this wins over 1\n"
    "  130, 143  gen, pack, import or export was interrupted by SIGINT or SIGTERM (128 + the\n"
    "     signal); the output file was left as it was, and no temporary file remains\n";

static void main_usage(FILE *f)
{
	fputs(main_usage_head, f);
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-8s  %s\n", commands[i]->name, commands[i]->summary);
	fputs(main_usage_tail, f);
}

/* The global options for URLs (--timeout). */
static kiln_remote_options remote = {.size = sizeof(remote)};
static int have_remote;

const kiln_remote_options *klnt_remote(void)
{
	return have_remote ? &remote : NULL;
}

void klnt_note_cache(const kiln_model *m)
{
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	kiln_error err;
	if (info.cache_refused && kiln_cache_check(klnt_remote(), &err))
		fprintf(stderr, "klnt: note: %s; fetched uncached\n", err.message);
}

static const struct klnt_cmd *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i]->name, name) == 0)
			return commands[i];
	return NULL;
}

static int main_usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "klnt: %s", what);
	if (arg) {
		fputs(" '", stderr);
		klnt_fputs_escaped(stderr, arg);
		fputc('\'', stderr);
	}
	fputs("\ntry 'klnt --help'\n", stderr);
	return KLNT_EXIT_USAGE;
}

/* Format a message, then escape all of it: arguments are file names and tensor names. */
__attribute__((format(printf, 2, 0))) static void escape_vformat(struct klnt_buf *out,
								 const char *fmt, va_list ap)
{
	va_list again;
	va_copy(again, ap);
	int n = vsnprintf(NULL, 0, fmt, ap);
	if (n >= 0) {
		char *tmp = klnt_xmalloc((size_t)n + 1);
		vsnprintf(tmp, (size_t)n + 1, fmt, again);
		klnt_escape(out, tmp, (size_t)n, 0);
		free(tmp);
	}
	va_end(again);
	klnt_buf_put(out, "", 0); /* never NULL, even for an empty message */
}

int klnt_usage_error(const struct klnt_cmd *cmd, const char *fmt, ...)
{
	struct klnt_buf msg = {0};
	va_list ap;
	va_start(ap, fmt);
	escape_vformat(&msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "klnt %s: %s\ntry 'klnt %s --help'\n", cmd->name, msg.p, cmd->name);
	klnt_buf_free(&msg);
	return KLNT_EXIT_USAGE;
}

int klnt_bad_option(const struct klnt_cmd *cmd, int c, char **argv)
{
	/*
	 * getopt_long leaves the culprit in different places: optopt holds a short option's
	 * letter, while a long option (optopt 0, or the option's value) is only found as the
	 * argument it consumed. Print the long name without any "=value" part.
	 */
	const char *arg = optind > 0 ? argv[optind - 1] : "";
	int is_long = strncmp(arg, "--", 2) == 0 && (optopt == 0 || c == ':' || strchr(arg, '='));
	if (is_long) {
		size_t len = strcspn(arg, "=");
		if (c == ':')
			return klnt_usage_error(cmd, "option '%.*s' needs an argument", (int)len,
						arg);
		if (optopt)
			return klnt_usage_error(cmd, "option '%.*s' takes no argument", (int)len,
						arg);
		return klnt_usage_error(cmd, "unknown or ambiguous option '%.*s'", (int)len, arg);
	}
	if (c == ':')
		return klnt_usage_error(cmd, "option '-%c' needs an argument", optopt);
	if (optopt > ' ' && optopt < 0x7F)
		return klnt_usage_error(cmd, "unknown option '-%c'", optopt);
	return klnt_usage_error(cmd, "unknown option");
}

int klnt_help(const struct klnt_cmd *cmd)
{
	fputs(cmd->usage, stdout);
	if (cmd->usage2)
		fputs(cmd->usage2, stdout);
	return KLNT_EXIT_OK;
}

const char *klnt_class(int code)
{
	return kiln_code_name(code);
}

int klnt_exit_for(int code)
{
	/* What the input holds (a format error, a tensor asked for that is not there, one the
	 * target cannot express) is a rejection like any other; what the system did is IO. */
	if (kiln_is_format_error(code) || code == KILN_INVAL || code == KILN_NOTFOUND ||
	    code == KILN_UNSUPPORTED || code == KILN_CORRUPT)
		return KLNT_EXIT_INVALID;
	return KLNT_EXIT_IO;
}

void klnt_report(FILE *f, const char *file, int code, const kiln_error *err)
{
	const char *msg = err && err->message[0] ? err->message : kiln_strerror(code);
	/* The file as kiln's messages show it: a URL's credentials left out. */
	char shown[4096];
	kiln_path_shown(file, shown, sizeof(shown));
	/* System errors already start with the path ("x.klnt: cannot open: ..."); the line starts
	 * with it too, so drop the repeat. */
	size_t flen = strlen(shown);
	if (strncmp(msg, shown, flen) == 0 && msg[flen] == ':' && msg[flen + 1] == ' ')
		msg += flen + 2;
	klnt_fputs_escaped(f, shown);
	fprintf(f, ": %s: ", klnt_class(code));
	klnt_fputs_escaped(f, msg);
	fputc('\n', f);
}

void klnt_errorf(const struct klnt_cmd *cmd, const char *fmt, ...)
{
	struct klnt_buf msg = {0};
	va_list ap;
	va_start(ap, fmt);
	escape_vformat(&msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "klnt %s: %s\n", cmd->name, msg.p);
	klnt_buf_free(&msg);
}

int klnt_write_stdout(const void *buf, size_t len)
{
	int e = klnt_flush_stdout();
	if (e)
		return e;
	const char *p = buf;
	while (len) {
		ssize_t w = write(STDOUT_FILENO, p, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* errno of the first failed flush of stdout: by the time main() looks, the stream only
 * remembers that something failed, not what. */
static int stdout_errno;

int klnt_flush_stdout(void)
{
	errno = 0;
	if (fflush(stdout) == 0)
		return 0;
	if (!stdout_errno)
		stdout_errno = errno ? errno : EIO;
	return stdout_errno;
}

static volatile sig_atomic_t caught_signal;

static void on_signal(int sig)
{
	caught_signal = sig;
}

void klnt_catch_signals(void)
{
	static const int sigs[] = {SIGINT, SIGTERM};
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old, sa = {.sa_handler = on_signal};
		/* SA_RESETHAND: a second signal takes the default action, for the impatient.
		 * SA_RESTART: other system calls carry on as if nothing happened. */
		sa.sa_flags = SA_RESETHAND | SA_RESTART;
		sigemptyset(&sa.sa_mask);
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
			sigaction(sigs[i], &sa, NULL);
	}
}

int klnt_caught_signal(void)
{
	return caught_signal;
}

int klnt_interrupted(const struct klnt_cmd *cmd, const char *out, int sig, int written)
{
	const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
	if (written)
		klnt_errorf(cmd, "%s: interrupted by %s after it was written", out, name);
	else
		klnt_errorf(cmd, "%s: interrupted by %s; left as it was", out, name);
	return KLNT_EXIT_SIGNAL + sig;
}

/*
 * Output that fails to reach stdout must not pass for success: a full disk would otherwise
 * leave a truncated listing and exit status 0. A reader that went away (EPIPE, as in
 * `klnt inspect big.klnt | head`) is normal and stays quiet, but still fails the command.
 */
static int finish_stdout(int rc)
{
	int e = klnt_flush_stdout();
	if (!e && !ferror(stdout))
		return rc;
	if (!e)
		e = stdout_errno ? stdout_errno : EIO;
	if (e != EPIPE)
		fprintf(stderr, "klnt: stdout: write error: %s\n", strerror(e));
	return KLNT_EXIT_IO;
}

int main(int argc, char **argv)
{
	/* A closed pipe must come back from write() as EPIPE so that each command can stop
	 * cleanly with its own status, instead of the process dying by signal mid-line. */
	signal(SIGPIPE, SIG_IGN);
	/* Every command reports bad options itself, in the house format. */
	opterr = 0;

	if (argc < 2)
		return main_usage_error("no command given", NULL);
	const char *arg = argv[1];
	if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
		main_usage(stdout);
		return finish_stdout(KLNT_EXIT_OK);
	}
	if (strcmp(arg, "--version") == 0 || strcmp(arg, "-V") == 0) {
		puts(kiln_version());
		return finish_stdout(KLNT_EXIT_OK);
	}
	if (strcmp(arg, "help") == 0) {
		if (argc > 3)
			return main_usage_error("help takes at most one command, not", argv[3]);
		if (argc == 2) {
			main_usage(stdout);
			return finish_stdout(KLNT_EXIT_OK);
		}
		const struct klnt_cmd *cmd = find_command(argv[2]);
		if (!cmd)
			return main_usage_error("unknown command", argv[2]);
		return finish_stdout(klnt_help(cmd));
	}
	if (strcmp(arg, "--timeout") == 0) {
		uint64_t s;
		if (argc < 3 || klnt_parse_u64(argv[2], UINT64_MAX / 1000, &s) || s == 0)
			return main_usage_error("--timeout wants a number of seconds, not",
						argc < 3 ? "" : argv[2]);
		remote.deadline_ms = s * 1000;
		have_remote = 1;
		argc -= 2, argv += 2;
		if (argc < 2)
			return main_usage_error("no command given", NULL);
		arg = argv[1];
	}
	if (arg[0] == '-')
		return main_usage_error("unknown option", arg);
	const struct klnt_cmd *cmd = find_command(arg);
	if (!cmd)
		return main_usage_error("unknown command", arg);
	return finish_stdout(cmd->run(cmd, argc - 1, argv + 1));
}
