/* SPDX-License-Identifier: MIT */
/*
 * The REMOTE source against real servers on 127.0.0.1 (tests/remote_test.sh starts nginx, Ceph's
 * S3 gateway and tests/servers/faultproxy.py, writes the fixtures and exports where they are):
 * every model opened from a URL is compared, tensor by tensor and byte by byte, with the same
 * file opened locally. The fault proxy stands in for the servers that misbehave.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "kiln/kiln.h"
#include "net/url.h" /* white box: the bearer token rule */

static const char *need(const char *var)
{
	const char *v = getenv(var);
	if (!v || !*v)
		cr_skip_test("%s is not set: run through tests/remote_test.sh", var);
	return v;
}

static char *url(const char *base, const char *path)
{
	char *u = NULL;
	cr_assert_geq(asprintf(&u, "%s/%s", base, path), 0);
	return u;
}

static char *local(const char *path)
{
	return url(need("KILN_TEST_ROOT"), path);
}

/* S3 through the environment, as the AWS tools would be configured. */
static void s3_env(void)
{
	setenv("AWS_ACCESS_KEY_ID", need("KILN_TEST_S3_ACCESS"), 1);
	setenv("AWS_SECRET_ACCESS_KEY", need("KILN_TEST_S3_SECRET"), 1);
	setenv("AWS_ENDPOINT_URL", need("KILN_TEST_S3_ENDPOINT"), 1);
	unsetenv("AWS_PROFILE");
	unsetenv("AWS_ENDPOINT_URL_S3");
}

static void *copy_of(const kiln_model *m, const kiln_tensor *t)
{
	void *p = malloc(t->byte_length ? t->byte_length : 1);
	kiln_error err;
	cr_assert_eq(kiln_tensor_copy(m, t->index, p, t->byte_length, &err), 0, "%s", err.message);
	return p;
}

/* The same tensors, names, shapes and bytes. */
static void same_models(const kiln_model *a, const kiln_model *b)
{
	cr_assert_eq(kiln_model_count(a), kiln_model_count(b));
	cr_assert_eq(kiln_model_files(a), kiln_model_files(b));
	for (uint64_t i = 0; i < kiln_model_count(a); i++) {
		const kiln_tensor *x = kiln_model_tensor(a, i), *y = kiln_model_tensor(b, i);
		cr_assert_eq(x->name_len, y->name_len);
		if (x->name_len)
			cr_assert_eq(memcmp(x->name, y->name, x->name_len), 0);
		cr_assert_eq(x->dtype, y->dtype);
		cr_assert_eq(x->rank, y->rank);
		cr_assert_eq(memcmp(x->shape, y->shape, sizeof(x->shape)), 0);
		cr_assert_eq(x->byte_length, y->byte_length);
		cr_assert_eq(x->file_offset, y->file_offset);
		void *p = copy_of(a, x), *q = copy_of(b, y);
		cr_assert_eq(memcmp(p, q, x->byte_length), 0, "tensor %llu differs",
			     (unsigned long long)i);
		if (x->data) /* a loaded remote model's pointers hold the same bytes */
			cr_assert_eq(memcmp(x->data, q, x->byte_length), 0);
		free(p);
		free(q);
	}
}

static kiln_model *open_ok(const char *path, const kiln_open_options *o)
{
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_open(path, o, &m, &err);
	cr_assert_eq(rc, 0, "%s: %s: %s", path, kiln_code_name(rc), err.message);
	return m;
}

static void same_as_local(const char *remote, const char *path, const kiln_open_options *o)
{
	char *l = local(path);
	kiln_model *a = open_ok(remote, o), *b = open_ok(l, NULL);
	kiln_model_info info;
	kiln_model_get_info(a, &info);
	cr_assert_eq(info.source, KILN_SOURCE_REMOTE);
	cr_assert_str_eq(kiln_source_name(info.source), "remote");
	same_models(a, b);
	kiln_model_close(a);
	kiln_model_close(b);
	free(l);
}

/* --- every format, every server ------------------------------------------------------------- */

Test(remote, http_klnt_loaded_and_directory_only)
{
	char *u = url(need("KILN_TEST_HTTP"), "m.klnt");
	same_as_local(u, "m.klnt", NULL);
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	kiln_model *m = open_ok(u, &o);
	for (uint64_t i = 0; i < kiln_model_count(m); i++)
		cr_assert_null(kiln_model_tensor(m, i)->data);
	kiln_model_close(m);
	same_as_local(u, "m.klnt", &o);
	free(u);
}

Test(remote, https_with_the_runs_ca)
{
	char *u = url(need("KILN_TEST_HTTPS"), "m.klnt");
	kiln_remote_options r = {.size = sizeof(r), .ca_bundle = need("KILN_TEST_CA")};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	same_as_local(u, "m.klnt", &o);
	/* Without it the server is not trusted: IO naming the URL and the TLS failure. */
	unsetenv("CURL_CA_BUNDLE");
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(u, NULL, &m, &err), KILN_IO);
	cr_assert(strstr(err.message, u) && strstr(err.message, "certificate"), "%s", err.message);
	free(u);
}

Test(remote, s3_every_format)
{
	s3_env();
	const char *files[] = {"m.klnt", "tiny-llama.gguf", "big-dir.klnt",
			       "tiny-sharded/model-00001-of-00002.safetensors"};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *u = url("s3://models", files[i]);
		same_as_local(u, files[i], NULL);
		kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
		same_as_local(u, files[i], &o);
		free(u);
	}
}

/* An S3 key is a name, sent as given: "dots/../y.klnt" is its own object (the GGUF sample),
 * not y.klnt (a KLNT file) as a normalized path would be. */
Test(remote, s3_keys_are_not_normalized)
{
	s3_env();
	kiln_model *m = open_ok("s3://models/dots/../y.klnt", NULL);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.format, KILN_FORMAT_GGUF);
	kiln_model_close(m);
}

Test(remote, s3_index_and_series)
{
	s3_env();
	same_as_local("s3://models/tiny-sharded/model.safetensors.index.json",
		      "tiny-sharded/model.safetensors.index.json", NULL);
	const char *shard = "s3://models/series-00002-of-00003.klnt";
	kiln_model *m = open_ok(shard, NULL);
	cr_assert_eq(kiln_model_files(m), 3);
	kiln_model_close(m);
	same_as_local(shard, "series-00002-of-00003.klnt", NULL);
	/* A series with a shard missing on the server. */
	kiln_error err;
	cr_assert_eq(kiln_model_open("s3://models/gap-00001-of-00002.klnt", NULL, &m, &err),
		     KILN_IO);
	cr_assert(strstr(err.message, "shard 2 of 2 is missing"), "%s", err.message);
}

Test(remote, streams_and_slices_from_a_directory_only_model)
{
	s3_env();
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	kiln_model *m = open_ok("s3://models/m.klnt", &o);
	char *lp = local("m.klnt");
	kiln_model *l = open_ok(lp, NULL);
	free(lp);
	kiln_stream_result res, want;
	kiln_error err;
	cr_assert_eq(kiln_model_read_all(m, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_read_all(l, NULL, &want, &err), 0, "%s", err.message);
	cr_assert_eq(res.bytes, want.bytes);
	cr_assert_gt(res.bytes, 20u << 20);
	const kiln_tensor *t = kiln_model_find_cstr(m, "blk.2.attn_qkv.weight");
	cr_assert_not_null(t);
	kiln_slice s = {.axis = 1, .start = 3, .stop = 40};
	uint64_t bytes = 0;
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), 0, "%s", err.message);
	void *a = malloc(bytes), *b = malloc(bytes);
	cr_assert_eq(kiln_tensor_read_slice(m, t->index, &s, a, bytes, NULL, NULL, &err), 0, "%s",
		     err.message);
	cr_assert_eq(kiln_tensor_read_slice(l, t->index, &s, b, bytes, NULL, NULL, &err), 0, "%s",
		     err.message);
	cr_assert_eq(memcmp(a, b, bytes), 0);
	free(a);
	free(b);
	kiln_model_close(m);
	kiln_model_close(l);
}

/* --- errors the servers give ---------------------------------------------------------------- */

Test(remote, wrong_secret_is_403_signature_does_not_match)
{
	s3_env();
	setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open("s3://models/m.klnt", NULL, &m, &err), KILN_IO);
	cr_assert_null(m);
	cr_assert_eq(err.sys_errno, EACCES);
	cr_assert(strstr(err.message, "s3://models/m.klnt (bytes 0-") &&
		      strstr(err.message, "HTTP 403 SignatureDoesNotMatch"),
		  "%s", err.message);
}

Test(remote, missing_object_and_bucket_are_404)
{
	s3_env();
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open("s3://models/none.klnt", NULL, &m, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert(strstr(err.message, "HTTP 404 NoSuchKey"), "%s", err.message);
	cr_assert_eq(kiln_model_open("s3://no-bucket/m.klnt", NULL, &m, &err), KILN_IO);
	cr_assert(strstr(err.message, "HTTP 404 NoSuchBucket"), "%s", err.message);
}

Test(remote, urls_kiln_cannot_use)
{
	const char *bad[] = {"s3://",          "s3://bucket", "s3://bucket/",
			     "s3://bu cket/k", "http://",     "https:///path"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kiln_model *m;
		kiln_error err;
		cr_assert_eq(kiln_model_open(bad[i], NULL, &m, &err), KILN_INVAL, "%s", bad[i]);
	}
	cr_assert(kiln_path_is_url("s3://b/k") && kiln_path_is_url("https://h/x") &&
		  !kiln_path_is_url("/tmp/s3://x") && !kiln_path_is_url("ftp://h/x"));
}

Test(remote, empty_and_foreign_objects)
{
	s3_env();
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open("s3://models/empty.klnt", NULL, &m, &err), KILN_LIMIT, "%s",
		     err.message);
	cr_assert_eq(kiln_model_open("s3://models/text.txt", NULL, &m, &err), KILN_FRAME, "%s",
		     err.message);
}

/* --- credentials and endpoints from the AWS files --------------------------------------------- */

static char *write_tmp(const char *name, const char *text)
{
	char *p = NULL;
	cr_assert_geq(asprintf(&p, "%s/remote-%d-%s", KILN_TEST_TMP, (int)getpid(), name), 0);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	return p;
}

Test(remote, profiles_from_the_shared_files)
{
	need("KILN_TEST_S3_ENDPOINT");
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_ENDPOINT_URL");
	unsetenv("AWS_ENDPOINT_URL_S3");
	unsetenv("AWS_REGION");
	unsetenv("AWS_DEFAULT_REGION");
	char *creds = NULL, *conf = NULL;
	cr_assert_geq(asprintf(&creds,
			       "[default]\naws_access_key_id = wrong\naws_secret_access_key = x\n"
			       "# a comment\n[kilntest]\naws_access_key_id = %s\n"
			       "aws_secret_access_key=%s\n",
			       need("KILN_TEST_S3_ACCESS"), need("KILN_TEST_S3_SECRET")),
		      0);
	cr_assert_geq(asprintf(&conf, "[profile kilntest]\nregion = us-east-1\nendpoint_url = %s\n",
			       need("KILN_TEST_S3_ENDPOINT")),
		      0);
	char *cp = write_tmp("credentials", creds), *fp = write_tmp("config", conf);
	setenv("AWS_SHARED_CREDENTIALS_FILE", cp, 1);
	setenv("AWS_CONFIG_FILE", fp, 1);
	setenv("AWS_PROFILE", "kilntest", 1);
	kiln_model *m = open_ok("s3://models/tiny-llama.gguf", NULL);
	kiln_model_close(m);
	/* The option names the profile over AWS_PROFILE. */
	kiln_remote_options r = {.size = sizeof(r), .profile = "nosuch"};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	kiln_error err;
	cr_assert_eq(kiln_model_open("s3://models/tiny-llama.gguf", &o, &m, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "nosuch"), "%s", err.message);
	unlink(cp);
	unlink(fp);
	free(cp);
	free(fp);
	free(creds);
	free(conf);
}

/* --- round trips ---------------------------------------------------------------------------- */

/* What the fault proxy says at /_WHAT/FAULT/PATH (at most 16 KiB, malloc'ed). */
static char *proxy_get(const char *what, const char *fault, const char *path)
{
	char *cmd = NULL;
	cr_assert_geq(
	    asprintf(&cmd, "curl -s %s/_%s/%s/%s", need("KILN_TEST_PROXY"), what, fault, path), 0);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	char *text = calloc(1, 16384);
	size_t n = fread(text, 1, 16383, p);
	text[n] = '\0';
	pclose(p);
	free(cmd);
	return text;
}

/* Requests the fault proxy has seen for FAULT/PATH. */
static long proxy_count(const char *fault, const char *path)
{
	char *text = proxy_get("count", fault, path), *end;
	long n = strtol(text, &end, 10);
	cr_assert(end != text, "no count: '%s'", text);
	free(text);
	return n;
}

/* What an index may name, at a URL: a shard below its own directory once decoded (the server
 * decodes "%2e%2e" to ".."), and never a host of the index's choosing (an index at a URL with
 * no path was taken to name "http://" + whatever it said). */
Test(remote, an_index_names_files_beside_it_only)
{
	kiln_model *m = NULL;
	kiln_error err;
	char *u = url(need("KILN_TEST_HTTP"), "sub/model.safetensors.index.json");
	int rc = kiln_model_open(u, NULL, &m, &err);
	cr_assert_eq(rc, KILN_TYPE, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert_not_null(strstr(err.message, "segment (once decoded)"), "%s", err.message);
	free(u);
	/* The proxy answers http://127.0.0.1:PORT?body=... (no path) with the body: an index
	 * naming a shard "127.0.0.1:PORT/ok:stolen/m.safetensors". */
	const char *proxy = need("KILN_TEST_PROXY"), *hostport = proxy + strlen("http://");
	char idx[512], enc[1536], *q = enc;
	snprintf(idx, sizeof(idx),
		 "{\"weight_map\":{\"a\":\"%s/ok:stolen/m.safetensors\",\"b\":\"%s/ok:stolen/"
		 "m.safetensors\",\"c\":\"%s/ok:stolen/m.safetensors\"}}",
		 hostport, hostport, hostport);
	for (const char *c = idx; *c; c++)
		q += sprintf(q, "%%%02X", (unsigned char)*c);
	cr_assert_geq(asprintf(&u, "%s?body=%s&name=.json", proxy, enc), 0);
	rc = kiln_model_open(u, NULL, &m, &err);
	cr_assert_neq(rc, 0, "an index at a URL with no path opened");
	cr_assert_eq(proxy_count("ok:stolen", "m.safetensors"), 0,
		     "a shard of its choosing was fetched");
	free(u);
}

Test(remote, open_in_one_or_two_round_trips)
{
	const char *proxy = need("KILN_TEST_PROXY");
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	/* A directory inside the first 256 KiB: one GET; a larger one: two. */
	const char *files[] = {"m.klnt", "big-dir.klnt",
			       "tiny-sharded/model-00001-of-00002.safetensors"};
	const long want[] = {1, 2, 1};
	for (size_t i = 0; i < 3; i++) {
		char *fault = NULL;
		cr_assert_geq(asprintf(&fault, "ok:%zu", i), 0);
		char *base = url(proxy, fault), *u = url(base, files[i]);
		kiln_model_close(open_ok(u, &o));
		cr_assert_eq(proxy_count(fault, files[i]), want[i], "%s", files[i]);
		free(u);
		free(base);
		free(fault);
	}
}

Test(remote, slices_of_a_directory_only_url_go_together)
{
	/* The left half along axis 1 of every 2-D float tensor: rows a small gap apart, fetched
	 * one GET per share, not one per row. Through cutnth:2 the second request (the first read
	 * after the open) is cut mid-body and resumed from its last byte: the rows still land
	 * where they belong. */
	const char *faults[] = {"ok:rows", "cutnth:2"};
	char *lp = local("m.klnt");
	kiln_model *l = open_ok(lp, NULL);
	free(lp);
	for (size_t f = 0; f < 2; f++) {
		char *base = url(need("KILN_TEST_PROXY"), faults[f]), *u = url(base, "m.klnt");
		kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
		kiln_model *m = open_ok(u, &o);
		uint64_t n = 0, rows = 0, idx[512];
		kiln_slice sl[512];
		void *got[512], *want[512];
		for (uint64_t i = 0; i < kiln_model_count(m) && n < 512; i++) {
			const kiln_tensor *t = kiln_model_tensor(m, i);
			if (t->rank != 2 || (t->dtype != KILN_DT_F32 && t->dtype != KILN_DT_F16 &&
					     t->dtype != KILN_DT_BF16))
				continue;
			sl[n] = (kiln_slice){.axis = 1, .start = 0, .stop = t->shape[1] / 2};
			uint64_t bytes;
			kiln_error err;
			cr_assert_eq(kiln_slice_size(t, &sl[n], &bytes, &err), 0, "%s",
				     err.message);
			got[n] = malloc(bytes ? bytes : 1);
			want[n] = malloc(bytes ? bytes : 1);
			idx[n++] = i;
			rows += t->shape[0];
		}
		cr_assert_gt(n, 10);
		kiln_error err;
		cr_assert_eq(kiln_read_slices(m, idx, sl, n, got, NULL, NULL, &err), 0, "%s: %s",
			     faults[f], err.message);
		cr_assert_eq(kiln_read_slices(l, idx, sl, n, want, NULL, NULL, &err), 0, "%s",
			     err.message);
		for (uint64_t k = 0; k < n; k++) {
			uint64_t bytes;
			kiln_slice_size(kiln_model_tensor(m, idx[k]), &sl[k], &bytes, &err);
			cr_assert_eq(memcmp(got[k], want[k], bytes), 0, "%s: tensor %" PRIu64,
				     faults[f], idx[k]);
			free(got[k]);
			free(want[k]);
		}
		long requests = proxy_count(faults[f], "m.klnt");
		cr_assert_lt(requests, (long)n + 8, "%s: %ld requests for %" PRIu64 " shares",
			     faults[f], requests, n);
		cr_assert_lt((uint64_t)requests, rows / 16);
		kiln_model_close(m);
		free(u);
		free(base);
	}
	kiln_model_close(l);
}

/* --- servers that misbehave ----------------------------------------------------------------- */

static int via_proxy(const char *fault, const char *path, const kiln_remote_options *r,
		     uint32_t flags, kiln_error *err)
{
	char *base = url(need("KILN_TEST_PROXY"), fault), *u = url(base, path);
	kiln_open_options o = {.size = sizeof(o), .flags = flags, .remote = r};
	kiln_model *m = NULL;
	int rc = kiln_model_open(u, &o, &m, err);
	if (!rc) {
		char *lp = local(path);
		kiln_model *l = open_ok(lp, NULL);
		same_models(m, l);
		kiln_model_close(l);
		kiln_model_close(m);
		free(lp);
	}
	free(u);
	free(base);
	return rc;
}

Test(remote, transient_faults_are_retried)
{
	/* Small chunks: the payload is many ranges, and each fault hits one of them. */
	kiln_remote_options r = {.size = sizeof(r), .chunk_size = 1u << 20, .stall_ms = 1000};
	const char *faults[] = {"503:3", "429:2", "reset:3", "cut:3", "stall:1"};
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) {
		kiln_error err;
		cr_assert_eq(via_proxy(faults[i], "m.klnt", &r, 0, &err), 0, "%s: %s", faults[i],
			     err.message);
	}
}

Test(remote, retries_run_out)
{
	kiln_remote_options r = {.size = sizeof(r), .retries = 2};
	kiln_error err;
	cr_assert_eq(via_proxy("503", "m.klnt", &r, 0, &err), KILN_IO);
	cr_assert(strstr(err.message, "HTTP 503 SlowDown, after 3 attempts"), "%s", err.message);
	r.retries = KILN_REMOTE_NO_RETRY;
	cr_assert_eq(via_proxy("reset", "m.klnt", &r, 0, &err), KILN_IO);
	cr_assert(strstr(err.message, "after 1 attempts"), "%s", err.message);
}

Test(remote, hostile_answers_are_errors)
{
	kiln_remote_options r = {.size = sizeof(r), .retries = 1};
	struct {
		const char *fault, *file, *says;
		int code, e;
	} cases[] = {
	    {"badrange", "m.klnt", "Content-Range bytes 1-", KILN_IO, EIO},
	    {"morebody", "m.klnt", "more than the", KILN_IO, EIO},
	    {"etag", "m.klnt", "changed since it was opened", KILN_IO, ESTALE},
	    {"norange", "m.klnt", "does not serve ranges", KILN_IO, EIO},
	    {"endless", "m.klnt", "no Content-Length", KILN_IO, EIO},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kiln_error err;
		int rc = via_proxy(cases[i].fault, cases[i].file, &r, 0, &err);
		cr_assert_eq(rc, cases[i].code, "%s: %s %s", cases[i].fault, kiln_code_name(rc),
			     err.message);
		cr_assert_eq(err.sys_errno, cases[i].e, "%s: %s", cases[i].fault, err.message);
		cr_assert(strstr(err.message, cases[i].says), "%s: %s", cases[i].fault,
			  err.message);
		cr_assert(strstr(err.message, "(bytes "), "%s", err.message);
	}
	/* A claimed size of 2^50 bytes is what the format checks, not what kiln allocates. */
	kiln_error err;
	int rc = via_proxy("hugelen", "m.klnt", &r, 0, &err);
	cr_assert(kiln_is_format_error(rc), "%s %s", kiln_code_name(rc), err.message);
	/* Range ignored, but the object fits the first GET: nothing more is asked. */
	cr_assert_eq(via_proxy("norange", "tiny-llama.gguf", &r, 0, &err), 0, "%s", err.message);
}

/* The version a load reads is one version: with a strong ETag If-Match; with a weak one (which
 * servers compare strongly: If-Match would fail every time) or none, If-Unmodified-Since the
 * Last-Modified date and each answer's date checked; with neither, an object read only when it
 * comes whole in the first answer. */
Test(remote, one_version_whatever_the_validator)
{
	kiln_remote_options r = {.size = sizeof(r), .chunk_size = 1u << 20};
	kiln_error err;
	cr_assert_eq(via_proxy("weaketag", "m.klnt", &r, 0, &err), 0, "%s", err.message);
	cr_assert_eq(via_proxy("noetag", "m.klnt", &r, 0, &err), 0, "%s", err.message);
	/* Another version after the first request: its date differs (or the server says 412). */
	int rc = via_proxy("noetag-flip", "m.klnt", &r, 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert_eq(err.sys_errno, ESTALE, "%s", err.message);
	/* No validator: what fits the first answer loads, the rest is refused. */
	cr_assert_eq(via_proxy("novalidator", "tiny-llama.gguf", &r, 0, &err), 0, "%s",
		     err.message);
	rc = via_proxy("novalidator", "m.klnt", &r, 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert(strstr(err.message, "neither an ETag nor a Last-Modified"), "%s", err.message);
}

/* A server that drips a few bytes a second never stalls, and still comes to an end: each request
 * may take the stall limit and its bytes at the least rate, then it is retried, then the open
 * fails naming the URL and the range. (It held kiln for as long as the server went on.) */
Test(remote, a_dripping_server_comes_to_an_end, .timeout = 60)
{
	kiln_remote_options r = {
	    .size = sizeof(r), .stall_ms = 1000, .retries = 1, .min_bytes_per_sec = 1u << 20};
	kiln_error err;
	time_t t0 = time(NULL);
	int rc = via_proxy("drip", "m.klnt", &r, 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert_eq(err.sys_errno, ETIMEDOUT, "%s", err.message);
	cr_assert(strstr(err.message, "/drip/m.klnt (bytes "), "%s", err.message);
	cr_assert_lt(time(NULL) - t0, 30, "the limit did not end it");
	/* The whole operation's deadline, as klnt --timeout and Python's timeout= set it. */
	kiln_remote_options d = {.size = sizeof(d), .deadline_ms = 2000};
	t0 = time(NULL);
	rc = via_proxy("drip", "m.klnt", &d, 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert_eq(err.sys_errno, ETIMEDOUT, "%s", err.message);
	cr_assert_lt(time(NULL) - t0, 15);
}

/* The headers of the last request the proxy saw for FAULT/PATH, "name: value" lines. */
static char *proxy_headers(const char *fault, const char *path)
{
	return proxy_get("headers", fault, path);
}

Test(remote, redirects_are_followed_within_bounds)
{
	kiln_error err;
	cr_assert_eq(via_proxy("redirect", "m.klnt", NULL, 0, &err), 0, "%s", err.message);
	cr_assert_geq(proxy_count("ok:redirected", "m.klnt"), 1);
	/* Only to http(s), and not forever. */
	cr_assert_eq(via_proxy("redirect-ftp", "m.klnt", NULL, 0, &err), KILN_IO);
	cr_assert(strstr(err.message, "/redirect-ftp/m.klnt") && strstr(err.message, "ftp"), "%s",
		  err.message);
	cr_assert_eq(via_proxy("redirect-loop", "m.klnt", NULL, 0, &err), KILN_IO);
	cr_assert(strstr(err.message, "redirect"), "%s", err.message);
}

Test(remote, hf_token_goes_to_hugging_face_only)
{
	setenv("HF_TOKEN", "hf_test_token", 1);
	kiln_error err;
	cr_assert_eq(via_proxy("ok:hf-other", "m.klnt", NULL, KILN_OPEN_DIRECTORY_ONLY, &err), 0,
		     "%s", err.message);
	char *h = proxy_headers("ok:hf-other", "m.klnt");
	cr_assert(h[0] && !strstr(h, "authorization"), "%s", h);
	free(h);
	/* The proxy in the place of huggingface.co (an HTTP proxy sees the request's headers). */
	setenv("http_proxy", need("KILN_TEST_PROXY"), 1);
	unsetenv("no_proxy");
	unsetenv("NO_PROXY");
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	kiln_model_close(open_ok("http://huggingface.co/ok:hf/m.klnt", &o));
	kiln_model_close(open_ok("http://cdn.hf.co/ok:hf-cdn/m.klnt", &o));
	kiln_model_close(open_ok("http://nothuggingface.co/ok:hf-not/m.klnt", &o));
	/* Over http:// (this proxy stands in for the hosts) the token is not sent at all: a bearer
	 * token in cleartext is anyone's on the path. Over https:// it goes to those hosts only
	 * (kiln__url_bearer, the one rule, below). */
	const char *sent[][2] = {{"ok:hf", "no"}, {"ok:hf-cdn", "no"}, {"ok:hf-not", "no"}};
	for (size_t i = 0; i < 3; i++) {
		h = proxy_headers(sent[i][0], "m.klnt");
		int has = strstr(h, "authorization: Bearer hf_test_token\n") != NULL;
		cr_assert_eq(has, !strcmp(sent[i][1], "yes"), "%s: %s", sent[i][0], h);
		free(h);
	}
}

/* The one rule for a bearer token (the proxy cannot stand in for an https:// host). */
Test(remote, bearer_token_over_https_to_hugging_face_only)
{
	setenv("HF_TOKEN", "hf_test_token", 1);
	cr_assert_str_eq(kiln__url_bearer("https://huggingface.co/m/resolve/main/x.safetensors"),
			 "hf_test_token");
	cr_assert_str_eq(kiln__url_bearer("https://cdn-lfs.hf.co/x"), "hf_test_token");
	cr_assert_null(kiln__url_bearer("http://huggingface.co/x"));
	cr_assert_null(kiln__url_bearer("http://hf.co/x"));
	cr_assert_null(kiln__url_bearer("https://nothuggingface.co/x"));
	cr_assert_null(kiln__url_bearer("https://huggingface.co.evil.example/x"));
	unsetenv("HF_TOKEN");
	cr_assert_null(kiln__url_bearer("https://huggingface.co/x"));
}

/* No credential of any kind follows a redirect to another origin: an S3 endpoint's 302 to
 * another host name gets neither the session token (a header of kiln's own) nor the signature;
 * a redirect within the origin keeps both. */
Test(remote, no_credential_follows_a_redirect_to_another_host)
{
	s3_env();
	setenv("AWS_SESSION_TOKEN", "session-token-456", 1);
	kiln_model *m;
	kiln_error err;
	char *ep = url(need("KILN_TEST_PROXY"), "redirect-host");
	setenv("AWS_ENDPOINT_URL", ep, 1);
	/* The redirect leads to nginx through the proxy: no bucket there, 404; headers recorded. */
	cr_assert_eq(kiln_model_open("s3://models/m.klnt", NULL, &m, &err), KILN_IO);
	char *h = proxy_headers("ok:xhost", "models/m.klnt");
	cr_assert(h[0], "the redirect was not followed");
	cr_assert_null(strstr(h, "x-amz-security-token"), "%s", h);
	cr_assert_null(strstr(h, "authorization"), "%s", h);
	free(h);
	free(ep);
	ep = url(need("KILN_TEST_PROXY"), "redirect");
	setenv("AWS_ENDPOINT_URL", ep, 1);
	cr_assert_eq(kiln_model_open("s3://models/m.klnt", NULL, &m, &err), KILN_IO);
	h = proxy_headers("ok:redirected", "models/m.klnt");
	cr_assert(strstr(h, "x-amz-security-token: session-token-456\n"), "%s", h);
	cr_assert(strstr(h, "authorization: AWS4-HMAC-SHA256"), "%s", h);
	free(h);
	free(ep);
}

/* A URL's password and query (a presigned signature) appear in no message. */
Test(remote, messages_leave_credentials_out)
{
	kiln_model *m;
	kiln_error err;
	const char *proxy = need("KILN_TEST_PROXY") + strlen("http://");
	char *u = NULL;
	cr_assert_geq(asprintf(&u,
			       "http://user:pa55word@%s/404/none.klnt?X-Amz-Signature=5ecret5ig&"
			       "X-Amz-Credential=AKIDSECRET&sig=abc123",
			       proxy),
		      0);
	int rc = kiln_model_open(u, NULL, &m, &err);
	cr_assert_eq(rc, KILN_IO, "%s", err.message);
	const char *secrets[] = {"pa55word", "5ecret5ig", "AKIDSECRET", "abc123"};
	for (size_t i = 0; i < 4; i++)
		cr_assert_null(strstr(err.message, secrets[i]), "%s", err.message);
	cr_assert(strstr(err.message, "none.klnt?..."), "%s", err.message);
	char shown[256];
	kiln_path_shown(u, shown, sizeof(shown));
	for (size_t i = 0; i < 4; i++)
		cr_assert_null(strstr(shown, secrets[i]), "%s", shown);
	free(u);
}

/* An error answer's body past what kiln reads of it loses neither its status nor its S3 code:
 * a 503 is retried, a 404 says so. */
Test(remote, big_error_bodies_keep_their_status)
{
	kiln_remote_options r = {.size = sizeof(r), .retries = 3};
	kiln_error err;
	cr_assert_eq(via_proxy("bigerror:2", "m.klnt", &r, 0, &err), 0, "%s", err.message);
	cr_assert_geq(proxy_count("bigerror:2", "m.klnt"), 3, "the 503s were not retried");
	cr_assert_eq(via_proxy("big404", "m.klnt", &r, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENOENT, "%s", err.message);
	cr_assert(strstr(err.message, "HTTP 404 NoSuchKey"), "%s", err.message);
}

Test(remote, session_token_is_sent_and_signed)
{
	s3_env();
	setenv("AWS_SESSION_TOKEN", "session-token-123", 1);
	char *ep = url(need("KILN_TEST_PROXY"), "ok:sts");
	setenv("AWS_ENDPOINT_URL", ep, 1);
	kiln_model *m;
	kiln_error err;
	/* The proxy forwards to nginx, which has no bucket "models": 404, the headers recorded. */
	cr_assert_eq(kiln_model_open("s3://models/m.klnt", NULL, &m, &err), KILN_IO);
	char *h = proxy_headers("ok:sts", "models/m.klnt"), *want = NULL;
	cr_assert(strstr(h, "x-amz-security-token: session-token-123\n"), "%s", h);
	cr_assert_geq(asprintf(&want, "authorization: AWS4-HMAC-SHA256 Credential=%s/",
			       need("KILN_TEST_S3_ACCESS")),
		      0);
	const char *auth = strstr(h, want);
	cr_assert(auth, "%s", h);
	const char *signed_h = strstr(auth, "SignedHeaders=");
	cr_assert(signed_h && strstr(signed_h, "x-amz-security-token") &&
		      strstr(signed_h, "x-amz-security-token") < strchr(signed_h, ','),
		  "the token is not signed: %s", h);
	free(want);
	free(h);
	free(ep);
}

Test(remote, deadline)
{
	kiln_remote_options r = {.size = sizeof(r), .deadline_ms = 1500, .stall_ms = 20000};
	kiln_error err;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	cr_assert_eq(via_proxy("stall", "m.klnt", &r, 0, &err), KILN_IO);
	clock_gettime(CLOCK_MONOTONIC, &b);
	cr_assert_eq(err.sys_errno, ETIMEDOUT, "%s", err.message);
	cr_assert(strstr(err.message, "deadline of 1500 ms"), "%s", err.message);
	cr_assert_lt(b.tv_sec - a.tv_sec, 10);
}

static int cancel_at_half(void *ctx, uint64_t done, uint64_t total)
{
	int *calls = ctx;
	++*calls;
	return done * 2 >= total;
}

Test(remote, progress_and_cancel)
{
	int calls = 0;
	kiln_remote_options r = {.size = sizeof(r),
				 .chunk_size = 1u << 20,
				 .max_bytes_per_sec = 16u << 20,
				 .progress = cancel_at_half,
				 .progress_ctx = &calls};
	kiln_error err;
	cr_assert_eq(via_proxy("ok", "m.klnt", &r, 0, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_gt(calls, 1);
}

static double mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Stops the load after a second; notes when. */
static int stop_after_a_second(void *ctx, const kiln_load_progress *p)
{
	(void)p;
	double *at = ctx; /* [0]: start, [1]: when it said stop */
	if (mono_now() - at[0] < 1.0)
		return 0;
	if (!at[1])
		at[1] = mono_now();
	return 1;
}

/* A cancel reaches the GETs in flight: a load of a URL stops within a poll of being told to,
 * not when the ranges it was fetching end (here about 48 s: 24 MiB at 64 KiB/s a connection). */
Test(remote, a_cancel_reaches_transfers_in_flight, .timeout = 60)
{
	char *base = url(need("KILN_TEST_PROXY"), "slow:99"), *u = url(base, "m.klnt");
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	kiln_model *m = open_ok(u, &o);
	double at[2] = {mono_now(), 0};
	kiln_load_options lo = {.size = sizeof(lo), .progress = stop_after_a_second, .ctx = at};
	kiln_arena *arena = NULL;
	kiln_error err;
	int rc = kiln_load(m, NULL, 0, &lo, NULL, &arena, NULL, &err);
	double took = mono_now() - at[1];
	cr_assert_eq(rc, KILN_CANCELED, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert(at[1] > 0);
	cr_assert_lt(took, 5.0, "the load went on %.1f s after it was stopped", took);
	cr_assert_null(arena);
	kiln_model_close(m);
	free(u);
	free(base);
}

/* radosgw killed and restarted while a payload is on its way: the ranges resume. */
static void *restart_rgw(void *arg)
{
	(void)arg;
	cr_assert_eq(system(getenv("KILN_TEST_RGW_RESTART")), 0);
	return NULL;
}

static int restart_once(void *ctx, uint64_t done, uint64_t total)
{
	pthread_t *t = ctx;
	static int started;
	if (!started && done * 4 >= total) {
		started = 1;
		pthread_create(t, NULL, restart_rgw, NULL);
	}
	return 0;
}

Test(remote, radosgw_restarted_mid_load)
{
	s3_env();
	need("KILN_TEST_RGW_RESTART");
	pthread_t t;
	kiln_remote_options r = {.size = sizeof(r),
				 .chunk_size = 1u << 20,
				 .connections = 2,
				 .max_bytes_per_sec = 8u << 20,
				 .progress = restart_once,
				 .progress_ctx = &t};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	same_as_local("s3://models/m.klnt", "m.klnt", &o);
	pthread_join(t, NULL);
}

/* --- options -------------------------------------------------------------------------------- */

Test(remote, options_checked)
{
	kiln_model *m;
	kiln_error err;
	kiln_remote_options r = {.size = sizeof(r), .connections = 65};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	cr_assert_eq(kiln_model_open("http://127.0.0.1:1/x", &o, &m, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "remote.connections");
	r = (kiln_remote_options){.chunk_size = 1000};
	cr_assert_eq(kiln_model_open("http://127.0.0.1:1/x", &o, &m, &err), KILN_INVAL);
	r = (kiln_remote_options){.reserved = {[2] = 1}};
	cr_assert_eq(kiln_model_open("http://127.0.0.1:1/x", &o, &m, &err), KILN_INVAL);
	o = (kiln_open_options){.flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_POPULATE};
	cr_assert_eq(kiln_model_open("http://127.0.0.1:1/x", &o, &m, &err), KILN_INVAL);
	/* Nothing listens on port 1: refused, retried, then IO naming it. */
	r = (kiln_remote_options){.retries = 1};
	o = (kiln_open_options){.remote = &r};
	cr_assert_eq(kiln_model_open("http://127.0.0.1:1/x.klnt", &o, &m, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ECONNREFUSED, "%s", err.message);
	cr_assert(strstr(err.message, "http://127.0.0.1:1/x.klnt (bytes 0-262143)"), "%s",
		  err.message);
}

/* A local file opened for its directory only: no data pointers, copies read the file. */
Test(remote, local_directory_only)
{
	char *p = local("m.klnt");
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	kiln_model *a = open_ok(p, &o), *b = open_ok(p, NULL);
	cr_assert_null(kiln_model_tensor(a, 0)->data);
	same_models(a, b);
	kiln_model_close(a);
	kiln_model_close(b);
	free(p);
}

/* --- one object's bytes to a sink ---------------------------------------------------------- */

struct sink {
	uint8_t *buf;
	size_t len, cap, calls, stop_after; /* stop_after: calls before refusing, 0: never */
};

static int to_sink(void *ctx, const void *data, size_t len)
{
	struct sink *s = ctx;
	if (s->stop_after && s->calls >= s->stop_after)
		return 1;
	s->calls++;
	cr_assert_leq(len, s->cap - s->len, "more bytes than the range holds");
	memcpy(s->buf + s->len, data, len);
	s->len += len;
	return 0;
}

static uint8_t *slurp_local(const char *path, size_t *len)
{
	char *lp = local(path);
	FILE *f = fopen(lp, "rb");
	cr_assert_not_null(f, "%s", lp);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	rewind(f);
	uint8_t *b = malloc(*len);
	cr_assert_eq(fread(b, 1, *len, f), *len);
	fclose(f);
	free(lp);
	return b;
}

/* Fetch [off, off + len) of PATH at BASE and compare it with the local file's bytes. */
static void fetch_same(const char *base, const char *path, const kiln_remote_options *r,
		       uint64_t off, uint64_t len)
{
	size_t n;
	uint8_t *want = slurp_local(path, &n);
	uint64_t end = len == KILN_FETCH_TO_END || off + len > n ? n : off + len;
	struct sink s = {.cap = (size_t)(end - off)};
	s.buf = malloc(s.cap + 1);
	char *u = url(base, path);
	uint64_t size = 0;
	kiln_error err;
	cr_assert_eq(kiln_remote_fetch(u, r, off, len, to_sink, &s, &size, &err), 0, "%s: %s", u,
		     err.message);
	cr_assert_eq(size, n);
	cr_assert_eq(s.len, end - off, "%s: %zu bytes", u, s.len);
	cr_assert_eq(memcmp(s.buf, want + off, s.len), 0, "%s: other bytes", u);
	free(u);
	free(s.buf);
	free(want);
}

Test(remote, fetch_ranges_to_a_sink)
{
	s3_env();
	const char *http = need("KILN_TEST_HTTP");
	fetch_same(http, "m.klnt", NULL, 0, KILN_FETCH_TO_END);
	fetch_same(http, "m.klnt", NULL, 12345, 1u << 20);
	fetch_same(http, "m.klnt", NULL, 1000, KILN_FETCH_TO_END);
	fetch_same("s3://models", "tiny-llama.gguf", NULL, 0, KILN_FETCH_TO_END);
	fetch_same("s3://models", "m.klnt", NULL, 7, 64);
	/* Cut and reset mid-body: the next attempt resumes where the sink was left. */
	char *base = url(need("KILN_TEST_PROXY"), "cut:2"),
	     *reset = url(need("KILN_TEST_PROXY"), "reset:2");
	fetch_same(base, "m.klnt", NULL, 0, KILN_FETCH_TO_END);
	fetch_same(reset, "m.klnt", NULL, 4096, 3u << 20);
	free(base);
	free(reset);
	/* A range past the end asks past a shorter object: what there is comes. */
	size_t n;
	free(slurp_local("m.klnt", &n));
	fetch_same(http, "m.klnt", NULL, n - 10, 1000);
}

Test(remote, fetch_errors)
{
	const char *http = need("KILN_TEST_HTTP");
	char *u = url(http, "m.klnt"), *missing = url(http, "no-such-file");
	struct sink s = {.cap = 64u << 20};
	s.buf = malloc(s.cap);
	kiln_error err;
	uint64_t size = 1;
	cr_assert_eq(kiln_remote_fetch("/local/path", NULL, 0, 1, to_sink, &s, &size, &err),
		     KILN_INVAL);
	cr_assert_eq(size, 0);
	cr_assert_eq(kiln_remote_fetch(u, NULL, 0, 1, NULL, &s, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_remote_fetch(u, NULL, 0, 0, to_sink, &s, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_remote_fetch(u, NULL, 2, UINT64_MAX - 1, to_sink, &s, NULL, &err),
		     KILN_INVAL);
	cr_assert_eq(s.calls, 0);
	/* 404 and 416 name the URL and the status. */
	cr_assert_eq(
	    kiln_remote_fetch(missing, NULL, 0, KILN_FETCH_TO_END, to_sink, &s, NULL, &err),
	    KILN_IO);
	cr_assert(strstr(err.message, missing) && strstr(err.message, "404"), "%s", err.message);
	cr_assert_eq(kiln_remote_fetch(u, NULL, 1ull << 40, 10, to_sink, &s, NULL, &err), KILN_IO);
	cr_assert(strstr(err.message, "416"), "%s", err.message);
	cr_assert_eq(s.calls, 0);
	/* A sink that stops: CANCELED, nothing more handed to it. */
	s.stop_after = 2;
	cr_assert_eq(kiln_remote_fetch(u, NULL, 0, KILN_FETCH_TO_END, to_sink, &s, NULL, &err),
		     KILN_CANCELED, "%s", err.message);
	cr_assert_eq(s.calls, 2);
	free(s.buf);
	free(u);
	free(missing);
}

/* --- the local cache ------------------------------------------------------------------------ */

/* Names in `dir`: cache entries, their links and anything else (a temporary left behind counts
 * too). */
static int count_files(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (d)
		closedir(d);
	return n;
}

static void remove_regular_files(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	struct stat st;
	for (struct dirent *e; (e = readdir(d));)
		if (!fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) && S_ISREG(st.st_mode))
			cr_assert_eq(unlinkat(dirfd(d), e->d_name, 0), 0);
	closedir(d);
}

static char *cache_dir(const char *name)
{
	char *d = NULL;
	cr_assert_geq(asprintf(&d, "%s/cache-%d-%s/sub", KILN_TEST_TMP, (int)getpid(), name), 0);
	return d;
}

Test(remote, cache_write_through_then_local)
{
	s3_env();
	char *dir = cache_dir("wt");
	kiln_remote_options r = {.size = sizeof(r), .cache_dir = dir};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	same_as_local("s3://models/m.klnt", "m.klnt", &o); /* fetched, and written through */
	cr_assert_eq(count_files(dir), 2);                 /* the copy and its link */
	/* The second open maps the cached copy; the model still names the URL. */
	kiln_model *m = open_ok("s3://models/m.klnt", &o);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	cr_assert_str_eq(fi.path, "s3://models/m.klnt");
	char *lp = local("m.klnt");
	kiln_model *l = open_ok(lp, NULL);
	same_models(m, l);
	kiln_model_close(m);
	kiln_model_close(l);
	free(lp);
	/* Through the proxy: a confirmed hit costs the first GET, a fresh one nothing. */
	char *base = url(need("KILN_TEST_PROXY"), "ok:c1"), *u = url(base, "tiny-llama.gguf");
	kiln_model_close(open_ok(u, &o));
	cr_assert_eq(proxy_count("ok:c1", "tiny-llama.gguf"), 1);
	kiln_model_close(open_ok(u, &o));
	cr_assert_eq(proxy_count("ok:c1", "tiny-llama.gguf"), 2);
	r.cache_max_age_ms = 60000;
	kiln_model_close(open_ok(u, &o));
	cr_assert_eq(proxy_count("ok:c1", "tiny-llama.gguf"), 2);
	free(u);
	free(base);
	free(dir);
}

static void s3_put(const char *file, const char *key)
{
	char *cmd = NULL;
	cr_assert_geq(
	    asprintf(&cmd,
		     "curl -sf --aws-sigv4 aws:amz:us-east-1:s3 -H 'x-amz-content-sha256: "
		     "UNSIGNED-PAYLOAD' --user %s:%s -T %s/%s %s/models/%s -o /dev/null",
		     need("KILN_TEST_S3_ACCESS"), need("KILN_TEST_S3_SECRET"),
		     need("KILN_TEST_ROOT"), file, need("KILN_TEST_S3_ENDPOINT"), key),
	    0);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	free(cmd);
}

Test(remote, cache_follows_a_changed_object_and_evicts)
{
	s3_env();
	char key[64];
	snprintf(key, sizeof(key), "v-%d.klnt", (int)getpid());
	char *u = url("s3://models", key), *dir = cache_dir("ch");
	s3_put("m.klnt", key);
	kiln_remote_options r = {.size = sizeof(r), .cache_dir = dir};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	same_as_local(u, "m.klnt", &o);
	/* A new version under the same key: fetched again, the old copy removed. */
	s3_put("big-dir.klnt", key);
	same_as_local(u, "big-dir.klnt", &o);
	cr_assert_eq(count_files(dir), 2);
	kiln_model *m = open_ok(u, &o);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP);
	kiln_model_close(m);
	/* A cap below the two: the least recently used goes. */
	r.cache_max_bytes = 26u << 20; /* m.klnt is 24 MiB, big-dir.klnt 4 */
	same_as_local("s3://models/m.klnt", "m.klnt", &o);
	cr_assert_eq(count_files(dir), 2, "the older entry and its link should be gone");
	/* The copies removed by hand (both names): the next open fetches again, even when a fresh
	 * copy would be used without asking. */
	remove_regular_files(dir);
	r.cache_max_age_ms = 60000;
	same_as_local("s3://models/m.klnt", "m.klnt", &o);
	cr_assert_eq(count_files(dir), 2);
	free(u);
	free(dir);
}

Test(remote, cache_has_nothing_partial)
{
	char *dir = cache_dir("cut");
	int calls = 0;
	kiln_remote_options r = {.size = sizeof(r),
				 .cache_dir = dir,
				 .chunk_size = 1u << 20,
				 .max_bytes_per_sec = 16u << 20,
				 .progress = cancel_at_half,
				 .progress_ctx = &calls};
	kiln_error err;
	cr_assert_eq(via_proxy("ok", "m.klnt", &r, 0, &err), KILN_CANCELED, "%s", err.message);
	/* A server that fails mid-payload, retries run out: nothing either. */
	r = (kiln_remote_options){
	    .size = sizeof(r), .cache_dir = dir, .retries = 1, .chunk_size = 1u << 20};
	cr_assert_eq(via_proxy("cut", "m.klnt", &r, 0, &err), KILN_IO);
	cr_assert_eq(count_files(dir), 0);
	free(dir);
}

/* --- a cache other users can reach ---------------------------------------------------------- */

/* The two names a load of `u` leaves in an empty private cache (its version, then its link),
 * learnt by doing it: they are predictable from the URL, the ETag and the size. */
static void learn_names(const char *u, char version[256], char link_name[256])
{
	char *dir = cache_dir("learn");
	kiln_remote_options r = {.size = sizeof(r), .cache_dir = dir};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	kiln_model_close(open_ok(u, &o));
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	version[0] = link_name[0] = '\0';
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.')
			snprintf(strchr(e->d_name, '-') ? version : link_name, 256, "%s",
				 e->d_name);
	closedir(d);
	cr_assert(version[0] && link_name[0]);
	remove_regular_files(dir);
	free(dir);
}

static int mkdirs(const char *path)
{
	char *cmd = NULL;
	cr_assert_geq(asprintf(&cmd, "mkdir -p '%s'", path), 0);
	int rc = system(cmd);
	free(cmd);
	return rc;
}

static char *in_dir(const char *dir, const char *name)
{
	return url(dir, name);
}

static void write_file(const char *path, const void *b, size_t n, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(write(fd, b, n), (ssize_t)n);
	cr_assert_eq(fchmod(fd, mode), 0);
	close(fd);
}

static int file_is(const char *path, const char *want)
{
	char got[64] = {0};
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(got, 1, sizeof(got) - 1, f) : 0;
	if (f)
		fclose(f);
	return n == strlen(want) && !memcmp(got, want, n);
}

/* m.klnt with one payload byte changed: the same size, other bytes. */
static void plant_substitute(const char *path, mode_t mode)
{
	size_t n;
	uint8_t *b = slurp_local("m.klnt", &n);
	b[n - 1] ^= 0x5a;
	write_file(path, b, n, mode);
	free(b);
}

/* The cache is a private store or nothing. In a directory others may write, names anyone can
 * compute were followed (a planted symlink made the cache write overwrite its target) and
 * entries planted there were served as the model. Such a directory is not used now, and says
 * why; in the user's own directory, a symlink at a name is replaced, never written through or
 * served, and an entry others may write is not served. */
Test(remote, cache_is_private_or_not_used)
{
	s3_env();
	const char *u = "s3://models/m.klnt";
	char version[256], lnk[256];
	learn_names(u, version, lnk);
	char *victim = in_dir(KILN_TEST_TMP, "cache-victim");
	write_file(victim, "secret", 6, 0600);

	/* A directory anyone may write: links at both names, then substituted entries. */
	char *pub = cache_dir("pub");
	kiln_remote_options r = {.size = sizeof(r), .cache_dir = pub, .cache_max_age_ms = 60000};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	kiln_error err;
	cr_assert_eq(kiln_cache_check(&r, &err), 0, "%s", err.message); /* not made yet */
	/* Limits from the environment are numbers or the cache is not used. */
	setenv("KILN_CACHE_MAX_BYTES", "10G", 1);
	cr_assert_eq(kiln_cache_check(&r, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EINVAL);
	cr_assert(strstr(err.message, "KILN_CACHE_MAX_BYTES is not a number"), "%s", err.message);
	unsetenv("KILN_CACHE_MAX_BYTES");
	cr_assert_eq(mkdirs(pub), 0);
	cr_assert_eq(chmod(pub, 0777), 0);
	char *pv = in_dir(pub, version), *pl = in_dir(pub, lnk);
	cr_assert_eq(symlink(victim, pv), 0);
	cr_assert_eq(symlink(victim, pl), 0);
	kiln_model *m = open_ok(u, &o);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.source, KILN_SOURCE_REMOTE);
	cr_assert_eq(info.cache_refused, EPERM);
	kiln_model_close(m);
	cr_assert(file_is(victim, "secret"), "the planted link was written through");
	cr_assert_eq(count_files(pub), 2, "nothing is written to a cache that is not private");
	cr_assert_eq(kiln_cache_check(&r, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EPERM);
	cr_assert(strstr(err.message, "others can write to it (mode 0777)"), "%s", err.message);
	unlink(pv);
	unlink(pl);
	plant_substitute(pv, 0644);
	cr_assert_eq(link(pv, pl), 0);
	same_as_local(u, "m.klnt", &o); /* fetched: the planted bytes are not the model */

	/* The user's own directory. A link at the version's name: the store replaces it. */
	char *own = cache_dir("own");
	r.cache_dir = own;
	cr_assert_eq(mkdirs(own), 0);
	cr_assert_eq(chmod(own, 0700), 0);
	char *ov = in_dir(own, version), *ol = in_dir(own, lnk);
	cr_assert_eq(symlink(victim, ov), 0);
	same_as_local(u, "m.klnt", &o);
	cr_assert(file_is(victim, "secret"), "the planted link was written through");
	struct stat st;
	cr_assert_eq(lstat(ov, &st), 0);
	cr_assert(S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600, "mode %o", st.st_mode);
	kiln_model_get_info(m = open_ok(u, &o), &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP); /* the entry it made is served */
	kiln_model_close(m);
	/* An entry others may write is not served, nor one reached through a symlink. */
	cr_assert_eq(unlink(ov), 0);
	cr_assert_eq(unlink(ol), 0);
	plant_substitute(ov, 0666);
	cr_assert_eq(link(ov, ol), 0);
	same_as_local(u, "m.klnt", &o);
	char *sub = in_dir(KILN_TEST_TMP, "cache-substitute");
	plant_substitute(sub, 0600);
	cr_assert_eq(unlink(ov), 0);
	cr_assert_eq(unlink(ol), 0);
	cr_assert_eq(symlink(sub, ol), 0);
	same_as_local(u, "m.klnt", &o);
	cr_assert_eq(lstat(ol, &st), 0);
	cr_assert(S_ISREG(st.st_mode), "the link is a file of the cache's own again");
	unlink(sub);
	unlink(victim);
	free(sub);
	free(ov);
	free(ol);
	free(own);
	free(pv);
	free(pl);
	free(pub);
	free(victim);
}

/* As root, with `nobody` as the other user (setpriv): a directory nobody owns is not used, and
 * nothing nobody plants in a root directory it may write reaches root's files or loads. */
Test(remote, cache_of_another_user_is_not_used)
{
	if (geteuid() != 0)
		cr_skip_test("needs root, to act as a second user (nobody) with setpriv");
	if (system("command -v setpriv >/dev/null"))
		cr_skip_test("setpriv (util-linux) is not installed");
	s3_env();
	const char *u = "s3://models/m.klnt";
	char version[256], lnk[256];
	learn_names(u, version, lnk);
	/* Under /tmp: nobody cannot reach the build tree of a root checkout. */
	char base[] = "/tmp/kiln-cache-test-XXXXXX";
	cr_assert_not_null(mkdtemp(base));
	cr_assert_eq(chmod(base, 0755), 0);
	char *victim = in_dir(base, "victim"), *dir = in_dir(base, "shared");
	write_file(victim, "secret", 6, 0600);
	cr_assert_eq(mkdir(dir, 0777), 0);
	cr_assert_eq(chmod(dir, 0777), 0); /* no sticky bit */
	char *cmd = NULL;
	const char *as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups";
	cr_assert_geq(asprintf(&cmd, "%s ln -s %s %s/%s && %s ln -s %s %s/%s", as_nobody, victim,
			       dir, version, as_nobody, victim, dir, lnk),
		      0);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	free(cmd);
	kiln_remote_options r = {.size = sizeof(r), .cache_dir = dir, .cache_max_age_ms = 60000};
	kiln_open_options o = {.size = sizeof(o), .remote = &r};
	same_as_local(u, "m.klnt", &o);
	cr_assert(file_is(victim, "secret"), "nobody's link made root overwrite its file");
	/* Bytes nobody wrote, at both names. */
	cr_assert_geq(asprintf(&cmd, "rm -f %s/*", dir), 0);
	cr_assert_eq(system(cmd), 0);
	free(cmd);
	char *sub = in_dir(base, "sub");
	plant_substitute(sub, 0644);
	cr_assert_geq(asprintf(&cmd, "%s sh -c 'cp %s %s/%s && ln %s/%s %s/%s'", as_nobody, sub,
			       dir, version, dir, version, dir, lnk),
		      0);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	free(cmd);
	same_as_local(u, "m.klnt", &o);
	/* A private directory of nobody's: not root's, not used. */
	char *theirs = in_dir(base, "theirs");
	cr_assert_eq(mkdir(theirs, 0700), 0);
	cr_assert_eq(chown(theirs, 65534, 65534), 0);
	r.cache_dir = theirs;
	kiln_error err;
	cr_assert_eq(kiln_cache_check(&r, &err), KILN_IO);
	cr_assert(strstr(err.message, "it belongs to uid 65534, not to this user (uid 0)"), "%s",
		  err.message);
	same_as_local(u, "m.klnt", &o);
	cr_assert_eq(count_files(theirs), 0);
	cr_assert_geq(asprintf(&cmd, "rm -rf %s", base), 0);
	cr_assert_eq(system(cmd), 0);
	free(cmd);
	free(theirs);
	free(sub);
	free(victim);
	free(dir);
}
