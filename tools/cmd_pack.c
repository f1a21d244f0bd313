/* SPDX-License-Identifier: MIT */
/*
 * klnt pack: build a file with kiln_write_file() from raw payload files. Payloads are streamed
 * through the writer's read callback with pread(), so a multi-gigabyte tensor never has to fit
 * in memory, and at most one raw file is open at a time however many tensors there are.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "klnt.h"

static const char usage[] =
    "usage: klnt pack [-v] [--no-sync] [--no-digests] OUT [--tensor SPEC [--quant Q] [--layout "
    "L]]...\n"
    "\n"
    "Write a KLNT v2 file OUT holding the given tensors, in order, in the canonical layout.\n"
    "OUT is replaced atomically (written to a temporary file, synced, then renamed) and keeps\n"
    "its mode; a symlink is followed. SIGINT or SIGTERM stop the write and leave OUT as it\n"
    "was. With no --tensor the file holds no tensors.\n"
    "\n"
    "  -t, --tensor NAME:DTYPE:SHAPE:RAWFILE\n"
    "      Add a tensor whose payload is the bytes of RAWFILE.\n"
    "      NAME   the tensor name; empty for an unnamed tensor. Either every tensor is named\n"
    "             or none is. Write ':' in a name as '\\:' and '\\' as '\\\\'.\n"
    "      DTYPE  bool u8 i8 u16 i16 u32 i32 u64 i64 f16 bf16 f32 f64 f8e4m3 f8e5m2 e8m0\n"
    "             e2m1 u4 i4, or opaque:CODE with CODE in 4096..32767 (needs --layout)\n"
    "      SHAPE  dimensions separated by ',' or 'x' (2,3 or 2x3); empty for a scalar\n"
    "      RAWFILE  the rest of the argument, taken as is. Its size must be exactly what\n"
    "             DTYPE and SHAPE take (4-bit types: two per byte, rounded up); for an opaque\n"
    "             tensor its size is the payload length.\n"
    "  --quant SCHEME:AXIS:GROUP:SCALE[:OUTER]\n"
    "      Quantize the last --tensor. SCHEME is block (or 1) or block+outer (or 2; needs\n"
    "      OUTER). SCALE and OUTER are tensor indices (3 or #3) or @NAME for the tensor of\n"
    "      that name, in the same escaping as NAME.\n"
    "  --layout NAME:BLOCK_SIZE\n"
    "      Layout name and block size of the last --tensor, for an opaque DTYPE.\n"
    "  --no-sync   do not fsync OUT before renaming it into place (faster, not crash safe)\n"
    "  --no-digests  write the tensors alone, without the file's digest table (its last\n"
    "              tensor, kiln.digests; docs/integrity.md)\n"
    "  -v, --verbose  describe each tensor and the result on stdout\n"
    "  -h, --help  show this help and exit\n"
    "\n"
    "Example:\n"
    "  klnt pack model.klnt --tensor w:e2m1:64,32:w.bin --quant block:1:32:@w.scale \\\n"
    "                       --tensor w.scale:e8m0:64:w_scale.bin\n"
    "\n"
    "Errors the format rules raise are printed as \"OUT: CLASS: message\".\n"
    "Exit status: 0 ok; 1 the tensors break a format rule (FRAME, TYPE, LIMIT, UTF8) or a\n"
    "RAWFILE has the wrong size; 2 usage error; 3 a file could not be read or written (or OUT\n"
    "not synced); 130, 143 interrupted by SIGINT, SIGTERM.\n";

enum { OPT_QUANT = 256, OPT_LAYOUT, OPT_NO_SYNC, OPT_NO_DIGESTS };

/* Payload source of one tensor, the read callback's context. */
struct raw {
	const char *path;
	uint64_t size; /* st_size when the arguments were checked */
	int fd;        /* open only while the writer streams this tensor */
	int failed;    /* the callback failed; why is in msg */
	char msg[160];
};

struct pack_tensor {
	kiln_tensor_spec spec;
	const char *arg; /* the --tensor argument, for messages */
	char *name;      /* unescaped; NULL when unnamed */
	char *layout;
	char *scale_ref; /* "@name" references, resolved once every tensor is known */
	char *outer_ref;
	int has_quant, has_layout;
	struct raw raw;
};

struct pack {
	const struct klnt_cmd *cmd;
	struct pack_tensor *t;
	uint32_t n, cap;
};

/*
 * Cut the next field off *p at the first ':' that no backslash escapes, undoing the escapes
 * "\:" and "\\" (any other backslash stays, so ordinary names need no thought). *p becomes
 * NULL after the last field. The caller frees the result.
 */
static char *next_field(const char **p)
{
	const char *s = *p;
	char *out = klnt_xmalloc(strlen(s) + 1), *o = out;
	for (;;) {
		if (*s == '\0') {
			*p = NULL;
			break;
		}
		if (*s == ':') {
			*p = s + 1;
			break;
		}
		if (*s == '\\' && (s[1] == ':' || s[1] == '\\'))
			s++;
		*o++ = *s++;
	}
	*o = '\0';
	return out;
}

static int parse_shape(const char *s, kiln_tensor_spec *spec)
{
	if (!*s)
		return 0; /* a scalar */
	unsigned rank = 0;
	while (s) {
		size_t len = strcspn(s, ",x");
		if (rank == KILN_MAX_RANK || len == 0 || len > 20)
			return -1;
		char dim[21];
		memcpy(dim, s, len);
		dim[len] = '\0';
		if (klnt_parse_u64(dim, UINT64_MAX, &spec->shape[rank]))
			return -1;
		rank++;
		s = s[len] ? s + len + 1 : NULL;
	}
	spec->rank = (uint8_t)rank;
	return 0;
}

static int parse_dtype(struct pack *pk, const char **p, const char *arg, kiln_tensor_spec *spec)
{
	char *dtype = next_field(p);
	int rc = 0;
	if (strcmp(dtype, "opaque") == 0) {
		char *code = *p ? next_field(p) : NULL;
		uint64_t v;
		if (!code || klnt_parse_u64(code, KILN_DT_OPAQUE_MAX, &v) || v < KILN_DT_OPAQUE_MIN)
			rc = klnt_usage_error(pk->cmd,
					      "--tensor '%s': opaque needs a code in "
					      "4096..32767, as opaque:4096",
					      arg);
		else
			spec->dtype = (uint16_t)v;
		free(code);
	} else if ((spec->dtype = (uint16_t)kiln_dtype_from_name(dtype)) == 0) {
		rc = klnt_usage_error(pk->cmd, "--tensor '%s': unknown dtype '%s'", arg, dtype);
	}
	free(dtype);
	return rc;
}

static int add_tensor(struct pack *pk, const char *arg)
{
	if (pk->n == pk->cap) {
		pk->cap = pk->cap ? 2 * pk->cap : 8;
		pk->t = klnt_xrealloc(pk->t, pk->cap * sizeof(*pk->t));
	}
	struct pack_tensor *t = &pk->t[pk->n];
	memset(t, 0, sizeof(*t));
	t->arg = arg;
	t->raw.fd = -1;
	pk->n++; /* counted now so that cleanup frees what parsing allocated */

	const char *p = arg;
	t->name = next_field(&p);
	if (!p)
		goto missing;
	if (!t->name[0]) {
		free(t->name);
		t->name = NULL;
	}
	int rc = parse_dtype(pk, &p, arg, &t->spec);
	if (rc)
		return rc;
	if (!p)
		goto missing;
	char *shape = next_field(&p);
	rc = parse_shape(shape, &t->spec);
	free(shape);
	if (rc)
		return klnt_usage_error(pk->cmd,
					"--tensor '%s': SHAPE must be up to %d decimal "
					"dimensions below 2^64, separated by ',' or 'x'",
					arg, KILN_MAX_RANK);
	if (!p || !*p)
		goto missing;
	t->raw.path = p;
	return 0;
missing:
	return klnt_usage_error(pk->cmd, "--tensor '%s': expected NAME:DTYPE:SHAPE:RAWFILE", arg);
}

/* An index ("3" or "#3") straight into *index, or "@name" kept in *ref for later. */
static int parse_ref(const char *s, uint32_t *index, char **ref)
{
	uint64_t v;
	if (s[0] == '@' && s[1]) {
		*ref = klnt_xmalloc(strlen(s));
		strcpy(*ref, s + 1);
		return 0;
	}
	if (klnt_parse_u64(s + (s[0] == '#'), UINT32_MAX, &v))
		return -1;
	*index = (uint32_t)v;
	return 0;
}

static int add_quant(struct pack *pk, const char *arg)
{
	if (!pk->n)
		return klnt_usage_error(pk->cmd, "--quant '%s' comes before any --tensor", arg);
	struct pack_tensor *t = &pk->t[pk->n - 1];
	if (t->has_quant)
		return klnt_usage_error(pk->cmd, "--quant given twice for --tensor '%s'", t->arg);
	t->has_quant = 1;

	char *f[6] = {0};
	int nf = 0, rc = 0;
	for (const char *p = arg; p && nf < 6;)
		f[nf++] = next_field(&p);
	kiln_tensor_spec *s = &t->spec;
	uint64_t axis, group;
	if (strcmp(f[0], "block") == 0 || strcmp(f[0], "1") == 0)
		s->quant_scheme = KILN_QUANT_BLOCK;
	else if (strcmp(f[0], "block+outer") == 0 || strcmp(f[0], "2") == 0)
		s->quant_scheme = KILN_QUANT_BLOCK_OUTER;
	if (!s->quant_scheme || nf != 3 + s->quant_scheme ||
	    klnt_parse_u64(f[1], UINT16_MAX, &axis) || klnt_parse_u64(f[2], UINT32_MAX, &group) ||
	    parse_ref(f[3], &s->scale_index, &t->scale_ref) ||
	    (s->quant_scheme == KILN_QUANT_BLOCK_OUTER &&
	     parse_ref(f[4], &s->outer_index, &t->outer_ref))) {
		rc = klnt_usage_error(pk->cmd,
				      "--quant '%s': expected block:AXIS:GROUP:SCALE or "
				      "block+outer:AXIS:GROUP:SCALE:OUTER",
				      arg);
	} else {
		s->quant_axis = (uint16_t)axis;
		s->group_size = (uint32_t)group;
	}
	for (int i = 0; i < nf; i++)
		free(f[i]);
	return rc;
}

static int add_layout(struct pack *pk, const char *arg)
{
	if (!pk->n)
		return klnt_usage_error(pk->cmd, "--layout '%s' comes before any --tensor", arg);
	struct pack_tensor *t = &pk->t[pk->n - 1];
	if (t->has_layout)
		return klnt_usage_error(pk->cmd, "--layout given twice for --tensor '%s'", t->arg);
	t->has_layout = 1;
	/* The block size is a number, so the last ':' splits unambiguously and a layout name
	 * may contain ':' without escapes. */
	const char *colon = strrchr(arg, ':');
	uint64_t bs;
	if (!colon || klnt_parse_u64(colon + 1, UINT32_MAX, &bs))
		return klnt_usage_error(pk->cmd, "--layout '%s': expected NAME:BLOCK_SIZE", arg);
	size_t len = (size_t)(colon - arg);
	t->layout = klnt_xmalloc(len + 1);
	memcpy(t->layout, arg, len);
	t->layout[len] = '\0';
	t->spec.layout = t->layout;
	t->spec.layout_len = len;
	t->spec.block_size = (uint32_t)bs;
	return 0;
}

static int resolve_ref(struct pack *pk, const struct pack_tensor *t, const char *ref,
		       uint32_t *index)
{
	/* The first match: duplicate names are the writer's to reject, with its own message. */
	for (uint32_t j = 0; j < pk->n; j++) {
		if (pk->t[j].name && strcmp(pk->t[j].name, ref) == 0) {
			*index = j;
			return 0;
		}
	}
	return klnt_usage_error(pk->cmd, "--quant of --tensor '%s': no tensor is named '%s'",
				t->arg, ref);
}

/* The payload length DTYPE and SHAPE call for; -1 when it overflows, which the writer then
 * reports as LIMIT with the descriptor and field. */
static int expected_length(const kiln_tensor_spec *s, uint64_t *len)
{
	uint64_t count = 1, bits = kiln_dtype_bits(s->dtype);
	for (unsigned k = 0; k < s->rank; k++)
		if (s->shape[k] == 0)
			count = 0;
	for (unsigned k = 0; k < s->rank && count; k++)
		if (__builtin_mul_overflow(count, s->shape[k], &count))
			return -1;
	if (__builtin_mul_overflow(count, bits, &count))
		return -1;
	*len = count / 8 + (count % 8 != 0);
	return 0;
}

/* Check each RAWFILE before anything is written, and set the lengths the writer expects. */
static int check_raw(struct pack *pk)
{
	for (uint32_t i = 0; i < pk->n; i++) {
		struct pack_tensor *t = &pk->t[i];
		struct stat st;
		if (stat(t->raw.path, &st) != 0) {
			klnt_errorf(pk->cmd, "%s: cannot open: %s", t->raw.path, strerror(errno));
			return KLNT_EXIT_IO;
		}
		/* pread() needs a seekable file of known size: no pipes, no directories. */
		if (!S_ISREG(st.st_mode)) {
			klnt_errorf(pk->cmd, "%s: not a regular file", t->raw.path);
			return KLNT_EXIT_IO;
		}
		t->raw.size = (uint64_t)st.st_size;
		uint64_t want;
		if (kiln_dtype_is_opaque(t->spec.dtype)) {
			t->spec.byte_length = t->raw.size;
		} else if (expected_length(&t->spec, &want) == 0) {
			if (want != t->raw.size) {
				struct klnt_buf what = {0};
				klnt_dtype_text(&what, t->spec.dtype);
				klnt_buf_puts(&what, " ");
				klnt_shape_text(&what, t->spec.shape, t->spec.rank);
				klnt_errorf(pk->cmd,
					    "%s: %" PRIu64 " bytes, but %s takes %" PRIu64
					    " bytes (--tensor '%s')",
					    t->raw.path, t->raw.size, what.p, want, t->arg);
				klnt_buf_free(&what);
				return KLNT_EXIT_INVALID;
			}
			t->spec.byte_length = want;
		}
	}
	return 0;
}

/* Note why a read failed, for the report, and return the errno the writer expects. The
 * writer's own message only says that the callback failed. */
__attribute__((format(printf, 3, 4))) static int raw_fail(struct raw *r, int e, const char *fmt,
							  ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
	r->failed = 1;
	return e ? e : EIO;
}

/* kiln_payload_fn: the writer asks for each tensor's bytes in ascending chunks. */
static int read_raw(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	struct raw *r = ctx;
	(void)tensor;
	/* Stopping here makes kiln_write_file remove its temporary file and return CANCELED. */
	if (klnt_caught_signal())
		return ECANCELED;
	if (r->fd < 0) {
		r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
		if (r->fd < 0)
			return raw_fail(r, errno, "cannot open: %s", strerror(errno));
		struct stat st;
		if (fstat(r->fd, &st) != 0)
			return raw_fail(r, errno, "cannot stat: %s", strerror(errno));
		/* The descriptor already promises this length: a changed file must not slip
		 * through as a silently shortened or mixed payload. */
		if ((uint64_t)st.st_size != r->size)
			return raw_fail(r, EIO,
					"changed size from %" PRIu64 " to %" PRIu64
					" bytes while packing",
					r->size, (uint64_t)st.st_size);
		/* Read once, front to back: let the kernel read ahead harder. */
		posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	}
	char *p = buf;
	for (size_t done = 0; done < len;) {
		ssize_t got = pread(r->fd, p + done, len - done, (off_t)(offset + done));
		if (got < 0) {
			if (errno == EINTR)
				continue;
			return raw_fail(r, errno, "read failed at byte %" PRIu64 ": %s",
					offset + done, strerror(errno));
		}
		if (got == 0)
			return raw_fail(r, EIO,
					"ended at byte %" PRIu64 " of %" PRIu64
					" (changed while packing?)",
					offset + done, r->size);
		done += (size_t)got;
	}
	if (offset + len == r->size) {
		close(r->fd);
		r->fd = -1;
	}
	return 0;
}

static void print_verbose(const char *out, const struct pack *pk, const kiln_tensor_spec *specs)
{
	struct klnt_buf line = {0};
	for (uint32_t i = 0; i < pk->n; i++) {
		const kiln_tensor_spec *s = &specs[i];
		klnt_buf_reset(&line);
		klnt_buf_printf(&line, "#%" PRIu32 " ", i);
		if (s->name)
			klnt_escape(&line, s->name, s->name_len, 1);
		else
			klnt_buf_puts(&line, "-");
		klnt_buf_puts(&line, " ");
		klnt_dtype_text(&line, s->dtype);
		klnt_buf_puts(&line, " ");
		klnt_shape_text(&line, s->shape, s->rank);
		klnt_buf_printf(&line, " %" PRIu64 " byte%s from ", s->byte_length,
				s->byte_length == 1 ? "" : "s");
		klnt_escape(&line, pk->t[i].raw.path, strlen(pk->t[i].raw.path), 0);
		puts(line.p);
	}
	klnt_buf_free(&line);
	uint64_t block = 0;
	kiln_write_size(specs, pk->n, &block, NULL);
	klnt_fputs_escaped(stdout, out);
	printf(": wrote %" PRIu32 " tensor%s, %" PRIu64 " bytes\n", pk->n, pk->n == 1 ? "" : "s",
	       block);
}

static int write_out(struct pack *pk, const char *out, uint32_t flags, int verbose)
{
	kiln_tensor_spec *specs = klnt_xmalloc((pk->n ? pk->n : 1) * sizeof(*specs));
	for (uint32_t i = 0; i < pk->n; i++) {
		struct pack_tensor *t = &pk->t[i];
		specs[i] = t->spec;
		specs[i].name = t->name;
		specs[i].name_len = t->name ? strlen(t->name) : 0;
		specs[i].read = read_raw;
		specs[i].read_ctx = &t->raw;
	}
	kiln_error err;
	klnt_catch_signals();
	int rc = kiln_write_file(out, specs, pk->n, flags, &err);
	int sig = klnt_caught_signal();
	for (uint32_t i = 0; i < pk->n; i++) {
		struct raw *r = &pk->t[i].raw;
		if (r->fd >= 0)
			close(r->fd);
		r->fd = -1;
		if (rc && r->failed) {
			klnt_fputs_escaped(stderr, out);
			fprintf(stderr, ": IO: tensor #%" PRIu32 ": ", i);
			klnt_fputs_path(stderr, r->path);
			fputs(": ", stderr);
			klnt_fputs_escaped(stderr, r->msg);
			fputc('\n', stderr);
		}
	}
	int exit_code = KLNT_EXIT_OK;
	if (sig && (rc == KILN_CANCELED || rc == KILN_OK || rc == KILN_UNSYNCED)) {
		exit_code = klnt_interrupted(pk->cmd, out, sig, rc != KILN_CANCELED);
	} else if (rc) {
		int reported = 0;
		for (uint32_t i = 0; i < pk->n; i++)
			reported |= pk->t[i].raw.failed;
		if (!reported)
			klnt_report(stderr, out, rc, &err);
		exit_code = klnt_exit_for(rc);
	} else if (verbose) {
		print_verbose(out, pk, specs);
	}
	free(specs);
	return exit_code;
}

static void pack_free(struct pack *pk)
{
	for (uint32_t i = 0; i < pk->n; i++) {
		free(pk->t[i].name);
		free(pk->t[i].layout);
		free(pk->t[i].scale_ref);
		free(pk->t[i].outer_ref);
	}
	free(pk->t);
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"tensor", required_argument, NULL, 't'},
	    {"quant", required_argument, NULL, OPT_QUANT},
	    {"layout", required_argument, NULL, OPT_LAYOUT},
	    {"no-sync", no_argument, NULL, OPT_NO_SYNC},
	    {"no-digests", no_argument, NULL, OPT_NO_DIGESTS},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct pack pk = {.cmd = cmd};
	uint32_t flags = 0;
	int verbose = 0, c, rc = 0;
	while (!rc && (c = getopt_long(argc, argv, ":t:vh", longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (pk.n == UINT32_MAX)
				rc = klnt_usage_error(cmd, "too many tensors");
			else
				rc = add_tensor(&pk, optarg);
			break;
		case OPT_QUANT:
			rc = add_quant(&pk, optarg);
			break;
		case OPT_LAYOUT:
			rc = add_layout(&pk, optarg);
			break;
		case OPT_NO_SYNC:
			flags |= KILN_WRITE_NO_SYNC;
			break;
		case OPT_NO_DIGESTS:
			flags |= KILN_WRITE_NO_DIGESTS;
			break;
		case 'v':
			verbose = 1;
			break;
		case 'h':
			pack_free(&pk);
			return klnt_help(cmd);
		default:
			rc = klnt_bad_option(cmd, c, argv);
		}
	}
	if (!rc && optind >= argc)
		rc = klnt_usage_error(cmd, "no output file given");
	if (!rc && argc - optind > 1)
		rc = klnt_usage_error(cmd,
				      "one output file; '%s' is extra (options such as "
				      "--tensor take their value as the next argument)",
				      argv[optind + 1]);
	for (uint32_t i = 0; i < pk.n && !rc; i++) {
		struct pack_tensor *t = &pk.t[i];
		if (t->scale_ref)
			rc = resolve_ref(&pk, t, t->scale_ref, &t->spec.scale_index);
		if (!rc && t->outer_ref)
			rc = resolve_ref(&pk, t, t->outer_ref, &t->spec.outer_index);
	}
	if (!rc)
		rc = check_raw(&pk);
	if (!rc)
		rc = write_out(&pk, argv[optind], flags, verbose);
	pack_free(&pk);
	return rc;
}

const struct klnt_cmd klnt_cmd_pack = {
    .name = "pack",
    .summary = "build a file from raw tensor data",
    .usage = usage,
    .run = run,
};
