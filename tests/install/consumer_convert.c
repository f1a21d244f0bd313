/* SPDX-License-Identifier: MIT */
/*
 * A program outside the kiln tree that uses the installed converters (kiln::convert, found with
 * find_package(kiln COMPONENTS convert)): it writes a small safetensors file, imports it with
 * kiln_import, and reads the metadata back with kiln_metadata_json (json-c underneath), so a
 * link missing json-c or kiln fails here. Prints one line.
 */
#include <kiln/convert.h>
#include <kiln/kiln.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what, const kiln_error *err)
{
	fprintf(stderr, "consumer_convert: %s: %s: %s\n", what, kiln_code_name(err->code),
		err->message);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: consumer_convert SRC.safetensors OUT.klnt\n");
		return 2;
	}
	/* The header is padded with spaces to 8 bytes, as the reference writer does. */
	char header[256];
	int n = snprintf(header, sizeof(header), "%s",
			 "{\"__metadata__\":{\"format\":\"pt\"},"
			 "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
	while (n % 8)
		header[n++] = ' ';
	const float w[2] = {1.5f, -2.0f};
	uint8_t len[8] = {0};
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t)((uint64_t)n >> (8 * i));
	FILE *f = fopen(argv[1], "wb");
	if (!f || fwrite(len, 1, 8, f) != 8 || fwrite(header, 1, (size_t)n, f) != (size_t)n ||
	    fwrite(w, 1, sizeof(w), f) != sizeof(w) || fclose(f) != 0) {
		perror(argv[1]);
		return 1;
	}

	const char *srcs[] = {argv[1]};
	kiln_convert_options o = {.size = sizeof(o), .write_flags = KILN_WRITE_NO_SYNC};
	kiln_convert_result r;
	kiln_error err;
	if (kiln_import(srcs, 1, argv[2], &o, &r, &err) != 0)
		return fail("import", &err);
	kiln_model *dir;
	if (kiln_model_open(argv[2], NULL, &dir, &err) != 0)
		return fail("open", &err);
	char *json;
	if (kiln_metadata_json(dir, &json, &err) != 0) {
		kiln_model_close(dir);
		return fail("metadata", &err);
	}
	const kiln_tensor *t = kiln_model_find_cstr(dir, "w");
	int same = t && t->byte_length == sizeof(w) && memcmp(t->data, w, sizeof(w)) == 0;
	printf("imported %u tensor%s, w %s, metadata %s\n", r.tensors, r.tensors == 1 ? "" : "s",
	       same ? "ok" : "wrong", strstr(json, "\"format\":\"pt\"") ? "kept" : json);
	kiln_free(json);
	kiln_model_close(dir);
	return same ? 0 : 1;
}
