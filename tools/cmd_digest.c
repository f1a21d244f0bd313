/* SPDX-License-Identifier: MIT */
/* klnt digest and klnt verify: content digests of a model's files in sidecars beside them
 * (kiln/verify.h), made once, then checked by reading every byte. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "klnt.h"

static const char digest_usage[] =
    "usage: klnt digest [--chunk BYTES] MODEL...\n"
    "\n"
    "Read every byte of each MODEL (a file, a shard of a series: the whole series, or a\n"
    "model.safetensors.index.json: the shards it names) and write the XXH3-128 digest of\n"
    "each chunk of each file into a sidecar beside it, FILE.kiln-digest. The model's own files\n"
    "are never written. 'klnt verify' checks them (docs/integrity.md has the table's layout).\n"
    "Progress goes to stderr when it is a terminal; Ctrl-C leaves no partial sidecar.\n"
    "\n"
    "Prints one line per MODEL: \"MODEL: N files, C chunks of S bytes, content HEX\", where HEX\n"
    "(the first file's table digest) identifies the bytes.\n"
    "\n"
    "Options:\n"
    "  --chunk BYTES  chunk size, a power of two from 4096 to 1 GiB (default 1 MiB); smaller\n"
    "                 chunks let a reader that reads a part check just that part\n"
    "  -h, --help     show this help and exit\n"
    "\n"
    "Exit status: 0 every sidecar written; 1 a MODEL was rejected; 2 usage error; 3 a file\n"
    "could not be read or written; 128+N interrupted by signal N.\n";

static const char verify_usage[] =
    "usage: klnt verify [-q] MODEL...\n"
    "\n"
    "Read every byte of each MODEL that its digests cover and check it. A file's digests are\n"
    "the first of: its sidecar FILE.kiln-digest that 'klnt digest' wrote (for a URL,\n"
    "URL.kiln-digest on the same server, or the copy of it kiln's cache kept with the\n"
    "version); the table kiln's writers put in the file (KLNT\n"
    "metadata, safetensors __metadata__, GGUF kiln.digests); a model_signing statement\n"
    "model.sig beside it (SHA-256 of the file or its shards; the signature itself is\n"
    "sigstore's to check: model_signing verify); the file's name when it is a Hugging Face\n"
    "cache blob (blobs/SHA-256). Progress goes to stderr when it is a terminal.\n"
    "\n"
    "Prints one line per MODEL on stdout:\n"
    "  MODEL: ok (N files, D digests, B bytes, ALGORITHM from SOURCE[, content HEX])\n"
    "         ALGORITHM xxh3-128 or sha256; SOURCE sidecar, embedded, model-signing or\n"
    "         hf-cache\n"
    "  MODEL: CORRUPT: FILE: chunk K (bytes A..B, tensor T) differs from its digest: ...\n"
    "  MODEL: NOTFOUND: FILE: no digests (...); make them once with: klnt digest FILE\n"
    "  MODEL: CLASS: message   a rejected model or digest table (FRAME, TYPE, LIMIT,\n"
    "                          UNSUPPORTED, CORRUPT for a damaged table), or IO\n"
    "\n"
    "Options:\n"
    "  -q, --quiet  print only the lines of models that are not ok\n"
    "  -h, --help   show this help and exit\n"
    "\n"
    "Exit status: 0 every byte matched; 1 a mismatch, a model without digests or a rejected\n"
    "model or table; 2 usage error; 3 a file could not be read; 128+N interrupted by signal N.\n";

/* BYTES as a power of two in range: its log2, or 0. */
static unsigned chunk_log2(const char *s)
{
	uint64_t v;
	if (klnt_parse_size(s, &v) || v < 4096 || v > (UINT64_C(1) << 30) || (v & (v - 1)))
		return 0;
	unsigned k = 0;
	while ((UINT64_C(1) << k) < v)
		k++;
	return k;
}

static int one(const struct klnt_cmd *cmd, const char *path, int write, unsigned log2, int quiet)
{
	kiln_open_options oo = {.size = sizeof(oo), .remote = klnt_remote()};
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open(path, &oo, &m, &err);
	kiln_verify_report r = {0};
	struct klnt_progress p = {.cmd = cmd, .tty = isatty(STDERR_FILENO)};
	kiln_digest_options o = {.size = sizeof(o),
				 .chunk_log2 = log2,
				 .progress = klnt_convert_progress,
				 .progress_ctx = &p};
	if (!rc) {
		klnt_note_cache(m);
		rc = write ? kiln_model_write_digests(m, &o, &r, &err)
			   : kiln_model_verify_digests(m, &o, &r, &err);
		kiln_model_close(m);
	}
	if (p.shown)
		fprintf(stderr, "\r%70s\r", "");
	int sig = klnt_caught_signal();
	if (sig && (rc == KILN_CANCELED || !rc || rc == KILN_UNSYNCED))
		return klnt_interrupted(cmd, path, sig, write && rc != KILN_CANCELED);
	if (rc == KILN_UNSYNCED) {
		klnt_report(stderr, path, rc, &err);
		rc = 0;
	}
	if (rc) {
		klnt_report(write ? stderr : stdout, path, rc, &err);
		return klnt_exit_for(rc);
	}
	char hex[33];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", r.content[i]);
	if (write) {
		klnt_fputs_path(stdout, path);
		printf(
		    ": %" PRIu32 " file%s, %" PRIu64 " chunks of %" PRIu64 " bytes, content %s\n",
		    r.files, r.files == 1 ? "" : "s", r.chunks, UINT64_C(1) << r.chunk_log2, hex);
	} else if (!quiet) {
		klnt_fputs_path(stdout, path);
		printf(": ok (%" PRIu32 " file%s, %" PRIu64 " digests, %" PRIu64
		       " bytes, %s from %s",
		       r.files, r.files == 1 ? "" : "s", r.chunks, r.bytes,
		       kiln_digest_algorithm_name(r.algorithm), kiln_digest_source_name(r.source));
		if (r.source == KILN_DIGESTS_SIDECAR)
			printf(", content %s", hex);
		puts(")");
	}
	return KLNT_EXIT_OK;
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv, int write)
{
	static const struct option longopts[] = {
	    {"chunk", required_argument, NULL, 'c'},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	unsigned log2 = 0;
	int quiet = 0, c;
	while ((c = getopt_long(argc, argv, write ? ":h" : ":qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			if (!write)
				return klnt_bad_option(cmd, '?', argv);
			log2 = chunk_log2(optarg);
			if (!log2)
				return klnt_usage_error(cmd,
							"--chunk %s: a power of two from 4096 to "
							"1073741824 bytes",
							optarg);
			break;
		case 'q':
			if (write)
				return klnt_bad_option(cmd, '?', argv);
			quiet = 1;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (optind >= argc)
		return klnt_usage_error(cmd, "no models given");
	klnt_catch_signals();
	int worst = KLNT_EXIT_OK;
	for (int i = optind; i < argc; i++) {
		int e = one(cmd, argv[i], write, log2, quiet);
		if (e >= KLNT_EXIT_SIGNAL)
			return e;
		if (e > worst)
			worst = e;
		klnt_flush_stdout();
	}
	return worst;
}

static int run_digest(const struct klnt_cmd *cmd, int argc, char **argv)
{
	return run(cmd, argc, argv, 1);
}

static int run_verify(const struct klnt_cmd *cmd, int argc, char **argv)
{
	return run(cmd, argc, argv, 0);
}

const struct klnt_cmd klnt_cmd_digest = {
    .name = "digest",
    .summary = "write content digests of models' files into sidecars beside them",
    .usage = digest_usage,
    .run = run_digest,
};

const struct klnt_cmd klnt_cmd_verify = {
    .name = "verify",
    .summary = "read every byte of models and check it against their digests",
    .usage = verify_usage,
    .run = run_verify,
};
