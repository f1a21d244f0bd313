/* SPDX-License-Identifier: MIT */
/* klnt check: certify files, running both the structural pass and payload verification. */
#define _GNU_SOURCE
#include <getopt.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt check [-q] FILE...\n"
    "\n"
    "Validate each FILE as a KLNT v2 block: header, descriptors, name heap and pad, then\n"
    "every payload byte (the gaps between payloads and 4-bit padding must be zero). This\n"
    "reads each file completely.\n"
    "\n"
    "Prints one line per file on stdout:\n"
    "  FILE: ok\n"
    "  FILE: CLASS: message   CLASS is FRAME, TYPE, LIMIT or UTF8 for a rejected file,\n"
    "                         IO when the file could not be opened or read\n"
    "\n"
    "Options:\n"
    "  -q, --quiet  print only the lines of files that are not ok\n"
    "  -h, --help   show this help and exit\n"
    "\n"
    "Exit status: 0 every file is valid; 1 a file was rejected and every file could be read;\n"
    "2 usage error; 3 a file could not be opened or read.\n";

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int quiet = 0, c;
	while ((c = getopt_long(argc, argv, ":qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'q':
			quiet = 1;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (optind >= argc)
		return klnt_usage_error(cmd, "no files given");

	int invalid = 0, io = 0;
	for (int i = optind; i < argc; i++) {
		const char *path = argv[i];
		kiln_open_options opts = {.size = sizeof(opts), .flags = KILN_OPEN_VERIFY_PAYLOAD};
		kiln_error err;
		kiln_dir *dir;
		int rc = kiln_dir_open(path, &opts, &dir, &err);
		kiln_dir_close(dir);
		if (rc == 0) {
			if (!quiet) {
				klnt_fputs_escaped(stdout, path);
				fputs(": ok\n", stdout);
			}
		} else {
			klnt_report(stdout, path, rc, &err);
			if (kiln_is_format_error(rc))
				invalid = 1;
			else
				io = 1;
		}
		/* Payload verification of a large file takes a while; show each verdict as it
		 * comes rather than when the buffer fills. */
		klnt_flush_stdout();
	}
	return io ? KLNT_EXIT_IO : invalid ? KLNT_EXIT_INVALID : KLNT_EXIT_OK;
}

const struct klnt_cmd klnt_cmd_check = {
    .name = "check",
    .summary = "validate files completely, structure and payload bytes",
    .usage = usage,
    .run = run,
};
