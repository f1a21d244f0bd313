/* SPDX-License-Identifier: MIT */
/*
 * klnt inspect: the header and the tensor table of a model of any format (KLNT, safetensors,
 * GGUF, sharded), as aligned text or as one JSON object. Only the structure is validated:
 * opening must not fault in payload pages of a large file.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/convert.h"
#include "klnt.h"

static const char usage[] =
    "usage: klnt inspect [--json] FILE\n"
    "\n"
    "Print the header fields and a table of the tensors of FILE: a KLNT, safetensors or GGUF\n"
    "file (its format, what it promises for alignment, and its metadata are shown). Only the\n"
    "structure is validated; payload bytes are not read. Use 'klnt check' to certify a file.\n"
    "A FILE named like a shard of a series (STEM-NNNNN-of-MMMMM.EXT), or a\n"
    "model.safetensors.index.json, shows the whole model: a line per shard instead of the\n"
    "header, one table with a shard column and indices counted across the shards, and totals\n"
    "for the model (--json: \"shards\" with each file's header, \"shard\" in every tensor).\n"
    "\n"
    "Table columns:\n"
    "  shard   (a series only) the shard, from 1\n"
    "  index   descriptor index (in a series, counted across the shards), as used by\n"
    "          'klnt cat FILE #INDEX'\n"
    "  dtype   dtype name; opaque(CODE) for a foreign layout code 4096..32767\n"
    "  shape   dimensions, [] for a scalar\n"
    "  bytes   byte_length of the payload\n"
    "  offset  offset of the payload from the start of the file\n"
    "  align   the payload's real alignment in memory: the largest power of two, up to\n"
    "          4096, dividing its address (KLNT: 64 or more; safetensors promises none)\n"
    "  quant   '-', or 'block axis=A group=G scale=#S' (scheme 1), or\n"
    "          'block+outer axis=A group=G scale=#S outer=#O' (scheme 2)\n"
    "  layout  '-', or the opaque layout name and block size, e.g. 'Q4_K bs=18'\n"
    "  name    the name in double quotes, or - (no quotes) for an unnamed tensor\n"
    "\n"
    "Metadata: a GGUF file's key/values, safetensors' __metadata__, or what 'klnt import' kept\n"
    "of either in a KLNT file (the tensor \"kiln.metadata\"); the text output sums it up on a\n"
    "\"metadata\" line (the source format and how many keys), --json shows all of it as the\n"
    "document docs/convert.md describes.\n"
    "\n"
    "Names and layout names are printed with control characters and other unsafe bytes\n"
    "escaped (\\n, \\t, \\\\, \\\", \\xNN, \\u{NNNN}); other UTF-8 is printed as is.\n"
    "\n"
    "Options:\n"
    "  -j, --json  print one JSON object instead: \"file\", \"header\", \"tensors\" (one\n"
    "              object per tensor; \"name\" is null when unnamed, \"quant\" null for\n"
    "              none, \"layout\" and \"block_size\" null unless opaque), \"totals\" and\n"
    "              \"metadata\" (the whole metadata document, or null)\n"
    "  -h, --help  show this help and exit\n"
    "\n"
    "Exit status: 0 ok; 1 the file was rejected (FRAME, TYPE, LIMIT, UTF8); 2 usage error;\n"
    "3 the file could not be opened or read. Errors go to stderr as \"FILE: CLASS: message\".\n";

static const char *scheme_name(unsigned scheme)
{
	return scheme == KILN_QUANT_BLOCK ? "block" : "block+outer";
}

/* Sums for the totals; the element count can overflow (an opaque tensor's shape is not tied
 * to its bytes), which is reported rather than wrapped. */
struct totals {
	uint64_t tensor_bytes;
	uint64_t elements;
	int elements_overflow;
};

static void add_totals(struct totals *tot, const kiln_tensor *t)
{
	tot->tensor_bytes += t->byte_length; /* the payload region bounds the sum */
	if (__builtin_add_overflow(tot->elements, t->count, &tot->elements))
		tot->elements_overflow = 1;
}

/* --- text ----------------------------------------------------------------------------------- */

enum {
	C_SHARD,
	C_INDEX,
	C_DTYPE,
	C_SHAPE,
	C_BYTES,
	C_OFFSET,
	C_ALIGN,
	C_QUANT,
	C_LAYOUT,
	C_NAME,
	NCOLS
};

static const char *const col_title[NCOLS] = {"shard",  "index", "dtype", "shape",  "bytes",
					     "offset", "align", "quant", "layout", "name"};
static const int col_right[NCOLS] = {
    [C_SHARD] = 1, [C_INDEX] = 1, [C_BYTES] = 1, [C_OFFSET] = 1, [C_ALIGN] = 1};

/* A series shows which shard each tensor is in (and its index counts across the shards); a
 * single file has no shard column. */
static int first_col = C_INDEX;

static void fill_row(struct klnt_buf *cell, const kiln_tensor *t, uint64_t index, uint32_t shard)
{
	for (int c = 0; c < NCOLS; c++)
		klnt_buf_reset(&cell[c]);
	klnt_buf_printf(&cell[C_SHARD], "%" PRIu32, shard + 1);
	klnt_buf_printf(&cell[C_INDEX], "%" PRIu64, index);
	klnt_dtype_text(&cell[C_DTYPE], t->dtype);
	klnt_shape_text(&cell[C_SHAPE], t->shape, t->rank);
	klnt_buf_printf(&cell[C_BYTES], "%" PRIu64, t->byte_length);
	klnt_buf_printf(&cell[C_OFFSET], "%" PRIu64, t->file_offset);
	klnt_buf_printf(&cell[C_ALIGN], "%" PRIu32, t->alignment);
	if (t->quant_scheme == KILN_QUANT_NONE) {
		klnt_buf_puts(&cell[C_QUANT], "-");
	} else {
		klnt_buf_printf(&cell[C_QUANT], "%s axis=%u group=%" PRIu32 " scale=#%" PRIu64,
				scheme_name(t->quant_scheme), t->quant_axis, t->group_size,
				t->scale_index);
		if (t->quant_scheme == KILN_QUANT_BLOCK_OUTER)
			klnt_buf_printf(&cell[C_QUANT], " outer=#%" PRIu64, t->outer_index);
	}
	if (t->layout) {
		klnt_escape(&cell[C_LAYOUT], t->layout, t->layout_len, 0);
		klnt_buf_printf(&cell[C_LAYOUT], " bs=%" PRIu32, t->block_size);
	} else {
		klnt_buf_puts(&cell[C_LAYOUT], "-");
	}
	/* Quoted, so that a tensor literally named "-" cannot pass for an unnamed one. */
	if (t->name)
		klnt_escape(&cell[C_NAME], t->name, t->name_len, 1);
	else
		klnt_buf_puts(&cell[C_NAME], "-");
}

static void print_row(const struct klnt_buf *cell, const size_t *width)
{
	/* The name goes last and unpadded: names are unbounded and would stretch every row. */
	for (int c = first_col; c < NCOLS; c++) {
		size_t w = klnt_text_width(cell[c].p, cell[c].len);
		size_t pad = c == C_NAME || w >= width[c] ? 0 : width[c] - w;
		if (col_right[c])
			printf("%*s", (int)pad, "");
		fputs(cell[c].p, stdout);
		if (c == C_NAME)
			break;
		printf("%*s  ", col_right[c] ? 0 : (int)pad, "");
	}
	putchar('\n');
}

static void print_flags(unsigned flags)
{
	printf("flags            0x%02x (", flags);
	const char *sep = "";
	if (flags & KILN_FLAG_NAMES) {
		fputs("NAMES", stdout);
		sep = "|";
	}
	if (flags & KILN_FLAG_LITTLE_ENDIAN)
		printf("%sLITTLE_ENDIAN", sep);
	puts(")");
}

/* The metadata document klnt import keeps (kiln_metadata_json), parsed; NULL when the file has
 * none. *bad is set when the tensor is there but does not hold a JSON object. */
static json_object *load_metadata(const kiln_model *dir, int *bad)
{
	char *text;
	kiln_error err;
	*bad = 0;
	int rc = kiln_metadata_json(dir, &text, &err);
	if (rc) {
		*bad = rc != KILN_NOTFOUND;
		return NULL;
	}
	/* nesting as deep as the converters write it (GGUF arrays of arrays) */
	json_tokener *tok = json_tokener_new_ex(512);
	json_object *doc = tok ? json_tokener_parse_ex(tok, text, (int)strlen(text)) : NULL;
	if (tok)
		json_tokener_free(tok);
	kiln_free(text);
	*bad = !doc;
	return doc;
}

static size_t count_keys(json_object *o)
{
	return json_object_is_type(o, json_type_object) ? (size_t)json_object_object_length(o) : 0;
}

/* "gguf, 24 keys": the source format and the keys it had (GGUF key/values; safetensors
 * __metadata__ entries plus the index file's). */
static void print_metadata(const kiln_model *dir)
{
	int bad;
	json_object *doc = load_metadata(dir, &bad);
	if (!doc) {
		if (bad)
			printf("metadata         (the %s tensor does not hold a JSON object)\n",
			       KILN_METADATA_TENSOR);
		return;
	}
	json_object *v;
	const char *source = "unknown";
	if (json_object_object_get_ex(doc, "source", &v) &&
	    json_object_is_type(v, json_type_string))
		source = json_object_get_string(v);
	size_t keys = 0;
	json_object *g, *st;
	if (json_object_object_get_ex(doc, "gguf", &g) && json_object_object_get_ex(g, "kv", &v) &&
	    json_object_is_type(v, json_type_array))
		keys += json_object_array_length(v);
	if (json_object_object_get_ex(doc, "safetensors", &st)) {
		if (json_object_object_get_ex(st, "metadata", &v))
			keys += count_keys(v);
		if (json_object_object_get_ex(st, "index_metadata", &v))
			keys += count_keys(v);
	}
	fputs("metadata         ", stdout);
	klnt_fputs_escaped(stdout, source);
	printf(", %zu key%s\n", keys, keys == 1 ? "" : "s");
	json_object_put(doc);
}

static void print_header(const char *path, const kiln_model *m)
{
	kiln_file_info info;
	kiln_model_file_info(m, 0, &info);
	fputs("file             ", stdout);
	klnt_fputs_path(stdout, path);
	if (info.format != KILN_FORMAT_KLNT) {
		/* A stock file: what its format says, and what it promises for alignment. */
		printf("\nformat           %s", kiln_format_name(info.format));
		if (info.version)
			printf(", version %" PRIu32, info.version);
		printf("\nalignment        %" PRIu32 "%s\n", info.alignment,
		       info.alignment == 1 ? " (the format promises none; see the align column)"
					   : " (general.alignment)");
		printf("tensor_count     %" PRIu64 "\n", info.tensor_count);
		printf("payload_base     %" PRIu64 "\n", info.payload_base);
		printf("payload_bytes    %" PRIu64 "\n", info.payload_bytes);
		printf("size             %" PRIu64 "\n", info.size);
		return;
	}
	printf("\nformat           klnt\n");
	printf("version          %u\n", info.version);
	print_flags(info.flags);
	printf("tensor_count     %" PRIu64 "\n", info.tensor_count);
	printf("name_bytes       %" PRIu32 "\n", info.name_bytes);
	printf("directory_bytes  %" PRIu64 "\n", info.directory_bytes);
	printf("payload_base     %" PRIu64 "\n", info.payload_base);
	printf("payload_bytes    %" PRIu64 "\n", info.payload_bytes);
	printf("block_length     %" PRIu64 "\n", info.size);
}

/* The shards of a series, one line each. */
static void print_shards(const char *path, const kiln_model *m)
{
	uint32_t n = kiln_model_files(m);
	kiln_model_info mi;
	kiln_model_get_info(m, &mi);
	fputs("series           ", stdout);
	klnt_fputs_path(stdout, path);
	printf(": %" PRIu32 " shards (%s)\n", n, kiln_format_name(mi.format));
	for (uint32_t s = 0; s < n; s++) {
		kiln_file_info info;
		kiln_model_file_info(m, s, &info);
		printf("shard %-10" PRIu32 " ", s + 1);
		klnt_fputs_path(stdout, info.path);
		printf(": %" PRIu64 " tensor%s, %" PRIu64 " payload bytes\n", info.tensor_count,
		       info.tensor_count == 1 ? "" : "s", info.payload_bytes);
	}
}

static void inspect_text(const char *path, const kiln_model *m)
{
	uint32_t shards = kiln_model_files(m);
	first_col = shards > 1 ? C_SHARD : C_INDEX;
	uint64_t payload = 0, tables = 0; /* tables: KLNT digest tables, in the payload region */
	uint32_t with_table = 0;
	for (uint32_t s = 0; s < shards; s++) {
		kiln_file_info info;
		kiln_model_file_info(m, s, &info);
		payload += info.payload_bytes;
		with_table += info.digests_bytes > 0;
		if (info.format == KILN_FORMAT_KLNT)
			tables += info.digests_bytes;
	}
	if (shards > 1)
		print_shards(path, m);
	else
		print_header(path, m);
	print_metadata(m);
	/* The file's own digest table (kiln/verify.h), checked by klnt verify. */
	if (with_table && shards > 1)
		printf("digests          in %" PRIu32 " of %" PRIu32 " files (kiln.digests)\n",
		       with_table, shards);
	else if (with_table)
		printf("digests          in the file (kiln.digests)\n");

	uint64_t n = kiln_model_count(m);
	struct totals tot = {0};
	if (n) {
		/* Two passes, measuring then printing, so no row has to be kept: a directory may
		 * hold millions of tensors. */
		struct klnt_buf cell[NCOLS] = {{0}};
		size_t width[NCOLS];
		for (int c = 0; c < NCOLS; c++) {
			width[c] = strlen(col_title[c]);
			klnt_buf_puts(&cell[c], col_title[c]);
		}
		for (uint64_t i = 0; i < n; i++) {
			const kiln_tensor *t = kiln_model_tensor(m, i);
			fill_row(cell, t, i, t->file);
			for (int c = 0; c < C_NAME; c++) {
				size_t w = klnt_text_width(cell[c].p, cell[c].len);
				if (w > width[c])
					width[c] = w;
			}
		}
		putchar('\n');
		for (int c = 0; c < NCOLS; c++) {
			klnt_buf_reset(&cell[c]);
			klnt_buf_puts(&cell[c], col_title[c]);
		}
		print_row(cell, width);
		for (uint64_t i = 0; i < n; i++) {
			const kiln_tensor *t = kiln_model_tensor(m, i);
			fill_row(cell, t, i, t->file);
			print_row(cell, width);
			add_totals(&tot, t);
		}
		for (int c = 0; c < NCOLS; c++)
			klnt_buf_free(&cell[c]);
	}
	printf("\n%" PRIu64 " tensor%s, %" PRIu64 " tensor bytes + %" PRIu64 " gap bytes", n,
	       n == 1 ? "" : "s", tot.tensor_bytes, payload - tot.tensor_bytes - tables);
	if (tables)
		printf(" + %" PRIu64 " digest table bytes", tables);
	printf(" = %" PRIu64 " payload bytes, ", payload);
	if (tot.elements_overflow)
		printf("more than 2^64-1 elements");
	else
		printf("%" PRIu64 " element%s", tot.elements, tot.elements == 1 ? "" : "s");
	if (shards > 1)
		printf(", in %" PRIu32 " shards", shards);
	putchar('\n');
}

/* --- JSON ----------------------------------------------------------------------------------- */

/* json-c returns NULL when memory runs out; a NULL value would silently print as null. */
static json_object *jnew(json_object *o)
{
	if (!o) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	return o;
}

static json_object *jstr(const char *s, size_t len)
{
	/* Names may hold U+0000, so never the NUL-terminated constructor for them. */
	return jnew(json_object_new_string_len(s, (int)len));
}

static json_object *ju64(uint64_t v)
{
	return jnew(json_object_new_uint64(v));
}

static void jset(json_object *obj, const char *key, json_object *val)
{
	if (json_object_object_add(obj, key, val) != 0) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
}

static void jpush(json_object *arr, json_object *val)
{
	if (json_object_array_add(arr, val) != 0) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
}

/* A file's header: what every format has, then KLNT's own fields. */
static json_object *json_header(const kiln_file_info *info)
{
	json_object *h = jnew(json_object_new_object());
	const char *format = kiln_format_name(info->format);
	jset(h, "format", jstr(format, strlen(format)));
	jset(h, "version", ju64(info->version));
	jset(h, "alignment", ju64(info->alignment));
	jset(h, "tensor_count", ju64(info->tensor_count));
	jset(h, "payload_base", ju64(info->payload_base));
	jset(h, "payload_bytes", ju64(info->payload_bytes));
	jset(h, "size", ju64(info->size));
	/* The file's own digest table (kiln/verify.h): where its bytes are, or null. */
	json_object *d = NULL;
	if (info->digests_bytes) {
		d = jnew(json_object_new_object());
		jset(d, "offset", ju64(info->digests_offset));
		jset(d, "bytes", ju64(info->digests_bytes));
	}
	jset(h, "digests", d);
	if (info->format != KILN_FORMAT_KLNT)
		return h;
	jset(h, "flags", ju64(info->flags));
	json_object *names = jnew(json_object_new_array());
	if (info->flags & KILN_FLAG_NAMES)
		jpush(names, jstr("NAMES", 5));
	if (info->flags & KILN_FLAG_LITTLE_ENDIAN)
		jpush(names, jstr("LITTLE_ENDIAN", 13));
	jset(h, "flag_names", names);
	jset(h, "name_bytes", ju64(info->name_bytes));
	jset(h, "directory_bytes", ju64(info->directory_bytes));
	jset(h, "block_length", ju64(info->size));
	return h;
}

static json_object *json_tensor(const kiln_tensor *t, uint64_t index, uint32_t shard, int sharded)
{
	json_object *o = jnew(json_object_new_object());
	if (sharded)
		jset(o, "shard", ju64(shard + 1));
	jset(o, "index", ju64(index));
	jset(o, "name", t->name ? jstr(t->name, t->name_len) : NULL);
	const char *dtype = kiln_dtype_name(t->dtype);
	jset(o, "dtype", dtype ? jstr(dtype, strlen(dtype)) : NULL);
	jset(o, "dtype_code", ju64(t->dtype));
	jset(o, "rank", ju64(t->rank));
	json_object *shape = jnew(json_object_new_array());
	for (unsigned k = 0; k < t->rank; k++)
		jpush(shape, ju64(t->shape[k]));
	jset(o, "shape", shape);
	jset(o, "count", ju64(t->count));
	jset(o, "byte_length", ju64(t->byte_length));
	jset(o, "byte_offset", ju64(t->byte_offset));
	jset(o, "file_offset", ju64(t->file_offset));
	jset(o, "alignment", ju64(t->alignment));
	json_object *q = NULL;
	if (t->quant_scheme != KILN_QUANT_NONE) {
		const char *scheme = scheme_name(t->quant_scheme);
		q = jnew(json_object_new_object());
		jset(q, "scheme", jstr(scheme, strlen(scheme)));
		jset(q, "axis", ju64(t->quant_axis));
		jset(q, "group_size", ju64(t->group_size));
		jset(q, "scale_index", ju64(t->scale_index));
		jset(q, "outer_index",
		     t->quant_scheme == KILN_QUANT_BLOCK_OUTER ? ju64(t->outer_index) : NULL);
	}
	jset(o, "quant", q);
	jset(o, "layout", t->layout ? jstr(t->layout, t->layout_len) : NULL);
	jset(o, "block_size", t->layout ? ju64(t->block_size) : NULL);
	return o;
}

static void inspect_json(const char *path, const kiln_model *m)
{
	uint32_t shards = kiln_model_files(m);
	json_object *root = jnew(json_object_new_object());
	/* A path is any bytes; JSON must be UTF-8. */
	char *file = klnt_utf8_sanitize(path);
	jset(root, "file", jstr(file, strlen(file)));
	free(file);
	kiln_model_info mi;
	kiln_model_get_info(m, &mi);
	const char *format = kiln_format_name(mi.format);
	jset(root, "format", jstr(format, strlen(format)));
	uint64_t payload = 0;
	json_object *list = shards > 1 ? jnew(json_object_new_array()) : NULL;
	for (uint32_t s = 0; s < shards; s++) {
		kiln_file_info info;
		kiln_model_file_info(m, s, &info);
		payload += info.payload_bytes;
		if (!list) {
			jset(root, "header", json_header(&info));
			continue;
		}
		json_object *sh = jnew(json_object_new_object());
		char *p = klnt_utf8_sanitize(info.path);
		jset(sh, "file", jstr(p, strlen(p)));
		free(p);
		jset(sh, "header", json_header(&info));
		jpush(list, sh);
	}
	if (list)
		jset(root, "shards", list);

	json_object *tensors = jnew(json_object_new_array());
	struct totals tot = {0};
	uint64_t n = kiln_model_count(m);
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		jpush(tensors, json_tensor(t, i, t->file, shards > 1));
		add_totals(&tot, t);
	}
	jset(root, "tensors", tensors);

	json_object *totals = jnew(json_object_new_object());
	jset(totals, "tensors", ju64(n));
	jset(totals, "tensor_bytes", ju64(tot.tensor_bytes));
	jset(totals, "gap_bytes", ju64(payload - tot.tensor_bytes));
	jset(totals, "payload_bytes", ju64(payload));
	jset(totals, "elements", tot.elements_overflow ? NULL : ju64(tot.elements));
	if (list)
		jset(totals, "shards", ju64(shards));
	jset(root, "totals", totals);
	int bad;
	jset(root, "metadata", load_metadata(m, &bad));

	int jflags =
	    JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE;
	const char *text = json_object_to_json_string_ext(root, jflags);
	if (!text) {
		fputs("klnt: out of memory\n", stderr);
		exit(KLNT_EXIT_IO);
	}
	puts(text);
	json_object_put(root);
}

static int run(const struct klnt_cmd *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int json = 0, c;
	while ((c = getopt_long(argc, argv, ":jh", longopts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = 1;
			break;
		case 'h':
			return klnt_help(cmd);
		default:
			return klnt_bad_option(cmd, c, argv);
		}
	}
	if (optind >= argc)
		return klnt_usage_error(cmd, "no file given");
	if (argc - optind > 1)
		return klnt_usage_error(cmd, "one file at a time; '%s' is extra", argv[optind + 1]);
	const char *path = argv[optind];

	kiln_error err;
	kiln_model *m;
	/* A URL's payload stays on the server: the directory is all inspect shows. */
	kiln_open_options o = {.size = sizeof(o),
			       .remote = klnt_remote(),
			       .flags = kiln_path_is_url(path) ? KILN_OPEN_DIRECTORY_ONLY : 0};
	int rc = kiln_model_open(path, &o, &m, &err);
	if (rc) {
		klnt_report(stderr, path, rc, &err);
		return klnt_exit_for(rc);
	}
	if (json)
		inspect_json(path, m);
	else
		inspect_text(path, m);
	kiln_model_close(m);
	return KLNT_EXIT_OK;
}

const struct klnt_cmd klnt_cmd_inspect = {
    .name = "inspect",
    .summary = "print the header and the tensor table (text or JSON)",
    .usage = usage,
    .run = run,
};
