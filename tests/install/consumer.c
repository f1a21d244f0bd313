/* SPDX-License-Identifier: MIT */
/*
 * A program outside the kiln tree, built by tests/install_test.sh against an installed kiln
 * (find_package(kiln) and pkg-config, shared and static). It writes a small file, opens it,
 * looks a tensor up (the name hash: libxxhash) and streams the payloads back (io_uring:
 * liburing), so a static link missing either dependency fails here. Prints one line.
 */
#include <kiln/kiln.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what, const kiln_error *err)
{
	fprintf(stderr, "consumer: %s: %s: %s\n", what, kiln_code_name(err->code), err->message);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: consumer FILE\n");
		return 2;
	}
	const float w[6] = {1, 2, 3, 4, 5, 6};
	const unsigned char b[3] = {7, 8, 9};
	kiln_tensor_spec t[2];
	memset(t, 0, sizeof(t));
	t[0].name = "w";
	t[0].name_len = 1;
	t[0].dtype = KILN_DT_F32;
	t[0].rank = 2;
	t[0].shape[0] = 2;
	t[0].shape[1] = 3;
	t[0].data = w;
	t[1].name = "b";
	t[1].name_len = 1;
	t[1].dtype = KILN_DT_U8;
	t[1].rank = 1;
	t[1].shape[0] = 3;
	t[1].data = b;
	kiln_error err;
	if (kiln_write_file(argv[1], t, 2, KILN_WRITE_NO_SYNC, &err) != 0)
		return fail("write", &err);

	kiln_model *dir;
	if (kiln_model_open(argv[1], NULL, &dir, &err) != 0)
		return fail("open", &err);
	const kiln_tensor *tw = kiln_model_find_cstr(dir, "w");
	float wback[6] = {0};
	unsigned char bback[3] = {0};
	void *const dests[2] = {wback, bback};
	kiln_stream_result res;
	int rc = kiln_stream(dir, NULL, 0, dests, NULL, &res, &err);
	int ok = rc == 0 && tw && memcmp(tw->data, w, sizeof(w)) == 0 &&
		 memcmp(wback, w, sizeof(w)) == 0 && memcmp(bback, b, sizeof(b)) == 0;
	printf("kiln %s (header %s): %llu tensors, w is %s, stream %s\n", kiln_version(),
	       KILN_VERSION_STRING, (unsigned long long)kiln_model_count(dir),
	       tw ? kiln_dtype_name(tw->dtype) : "missing", ok ? "ok" : "wrong");
	kiln_model_close(dir);
	if (rc != 0)
		return fail("stream", &err);
	return ok ? 0 : 1;
}
