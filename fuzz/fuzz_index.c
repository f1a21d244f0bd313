/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: a model.safetensors.index.json, as a server (or a local file) gives it, through
 * the resolver's policy for what an index may name (kiln__resolve_index_text, the open's own
 * path after the read). The first input byte picks where the index is (a URL with a directory,
 * a URL with none, an s3:// key, a local path, a bare local name); the rest is its text.
 *
 * Judged, for every index the resolver accepts: each file it names begins with the index's own
 * directory (for a URL with no path, its authority and a '/'), is remote exactly when the index
 * is, and what follows is a name of non-empty segments, none "." or ".." once percent-decoded,
 * with no scheme, and for a URL no '?', '#', backslash or escaped NUL: nothing an index says
 * reaches outside its directory or another host.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "fuzz.h"
#include "model/resolve.h"

static const struct {
	const char *path, *dir;
	int remote;
} where[] = {
    {"http://127.0.0.1:9/sub/model.safetensors.index.json", "http://127.0.0.1:9/sub/", 1},
    {"https://h.example/model.safetensors.index.json?X-Amz-Signature=s", "https://h.example/", 1},
    {"http://h.example", "http://h.example/", 1},
    {"s3://bucket/a/b/model.safetensors.index.json", "s3://bucket/a/b/", 1},
    {"/models/x/model.safetensors.index.json", "/models/x/", 0},
    {"model.safetensors.index.json", "", 0},
};

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

static void check_name(const char *name, int remote, const char *index)
{
	size_t n = strlen(name), k = 0;
	char *dec = malloc(n + 1);
	if (!dec)
		return;
	FUZZ_CHECK(n > 0, "%s: an empty name", index);
	FUZZ_CHECK(name[0] != '/', "%s: %s is absolute", index, name);
	size_t first = strcspn(name, "/");
	FUZZ_CHECK(!memchr(name, ':', first), "%s: %s names a scheme or host", index, name);
	for (size_t i = 0; i < n; i++) {
		if (remote && name[i] == '%') {
			int hi = i + 2 < n ? hexval(name[i + 1]) : -1,
			    lo = hi >= 0 ? hexval(name[i + 2]) : -1;
			FUZZ_CHECK(hi >= 0 && lo >= 0, "%s: %s has a bad escape", index, name);
			dec[k++] = (char)(hi << 4 | lo);
			i += 2;
		} else {
			dec[k++] = name[i];
		}
	}
	if (remote) {
		FUZZ_CHECK(!strpbrk(name, "?#\\"), "%s: %s holds ? # or \\", index, name);
		FUZZ_CHECK(!memchr(dec, 0, k) && !memchr(dec, '\\', k),
			   "%s: %s decodes to NUL or \\", index, name);
	}
	for (size_t i = 0; i <= k;) {
		const char *e = memchr(dec + i, '/', k - i);
		size_t len = e ? (size_t)(e - (dec + i)) : k - i;
		FUZZ_CHECK(len > 0, "%s: %s has an empty segment", index, name);
		FUZZ_CHECK(!(len == 1 && dec[i] == '.') && !(len == 2 && !memcmp(dec + i, "..", 2)),
			   "%s: %s has a . or .. segment", index, name);
		i += len + 1;
	}
	free(dec);
}

int kiln_fuzz_index(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t w = data[0] % (sizeof(where) / sizeof(where[0]));
	char *text = kiln__fuzz_cstr(data + 1, size - 1);
	if (!text)
		return 0;
	struct kiln__resolved r;
	memset(&r, 0, sizeof(r));
	kiln_error err;
	int rc = kiln__resolve_index_text(where[w].path, where[w].remote, text, size - 1, &r, &err);
	if (!rc) {
		size_t dl = strlen(where[w].dir);
		FUZZ_CHECK(r.n > 0, "%s: an index of no files", where[w].path);
		for (uint32_t i = 0; i < r.n; i++) {
			const char *p = r.files[i].path;
			FUZZ_CHECK(!strncmp(p, where[w].dir, dl), "%s names %s, outside %s",
				   where[w].path, p, where[w].dir);
			FUZZ_CHECK(r.files[i].remote == where[w].remote, "%s: %s remote %d",
				   where[w].path, p, r.files[i].remote);
			FUZZ_CHECK(kiln_path_is_url(p) == where[w].remote, "%s: %s is%s a URL",
				   where[w].path, p, where[w].remote ? " not" : "");
			check_name(p + dl, where[w].remote, where[w].path);
		}
	} else {
		FUZZ_CHECK(err.code == rc && err.message[0], "%s: failed with no message",
			   where[w].path);
	}
	kiln__resolved_free(&r);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_index(data, size);
}
#endif
