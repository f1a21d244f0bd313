/* SPDX-License-Identifier: MIT */
/*
 * Where s3:// leads and with which keys, as the AWS tools read it (include/kiln/remote.h): the
 * environment, then the shared credentials and config files (INI, at most 1 MiB each, wiped
 * from memory once read), a profile, a region and an endpoint.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/sys.h"
#include "net/aws.h"

char *kiln__aws_ini_value(const char *text, const char *section, const char *key,
			  int *found_section)
{
	size_t slen = strlen(section), klen = strlen(key);
	int in = 0;
	const char *p = text;
	while (*p) {
		const char *eol = strchr(p, '\n');
		if (!eol)
			eol = p + strlen(p);
		const char *a = p, *b = eol;
		while (a < b && isspace((unsigned char)*a))
			a++;
		while (b > a && isspace((unsigned char)b[-1]))
			b--;
		if (a < b && *a == '[') {
			const char *c = memchr(a, ']', (size_t)(b - a));
			const char *s = a + 1, *e = c ? c : b;
			while (s < e && isspace((unsigned char)*s))
				s++;
			while (e > s && isspace((unsigned char)e[-1]))
				e--;
			in = (size_t)(e - s) == slen && !memcmp(s, section, slen);
			if (in && found_section)
				*found_section = 1;
		} else if (in && a < b && *a != '#' && *a != ';') {
			const char *eq = memchr(a, '=', (size_t)(b - a));
			if (eq) {
				const char *ke = eq;
				while (ke > a && isspace((unsigned char)ke[-1]))
					ke--;
				const char *v = eq + 1;
				while (v < b && isspace((unsigned char)*v))
					v++;
				if ((size_t)(ke - a) == klen && !strncasecmp(a, key, klen))
					return strndup(v, (size_t)(b - v));
			}
		}
		p = *eol ? eol + 1 : eol;
	}
	return NULL;
}

/* A whole small file, or NULL when it cannot be read (absent is not an error). */
static char *slurp(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return NULL;
	char *buf = malloc(KILN__AWS_FILE_MAX + 1);
	size_t n = buf ? fread(buf, 1, KILN__AWS_FILE_MAX, fp) : 0;
	fclose(fp);
	if (buf)
		buf[n] = '\0';
	return buf;
}

static char *home_file(const char *var, const char *rel)
{
	const char *v = kiln__env(var);
	if (v)
		return strdup(v);
	const char *home = kiln__env("HOME");
	char *p = NULL;
	if (home && asprintf(&p, "%s/%s", home, rel) < 0)
		p = NULL;
	return p;
}

void kiln__aws_free(struct kiln__aws *a)
{
	free(a->access);
	if (a->secret)
		explicit_bzero(a->secret, strlen(a->secret));
	free(a->secret);
	free(a->token);
	free(a->region);
	free(a->endpoint);
}

static char *dup_opt(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* Whether `text` (NULL: no file) has the section. */
static int has_section(const char *text, const char *section)
{
	int found = 0;
	if (text)
		free(kiln__aws_ini_value(text, section, "", &found));
	return found;
}

/* The keys of `section` of one file, unless an earlier place gave any (one place gives both). */
static void keys_from(struct kiln__aws *a, const char *text, const char *section)
{
	if (a->access || a->secret || !text)
		return;
	a->access = kiln__aws_ini_value(text, section, "aws_access_key_id", NULL);
	a->secret = kiln__aws_ini_value(text, section, "aws_secret_access_key", NULL);
	if (a->access || a->secret)
		a->token = kiln__aws_ini_value(text, section, "aws_session_token", NULL);
}

int kiln__aws_settings(const kiln_remote_options *o, struct kiln__aws *a, kiln_error *err)
{
	memset(a, 0, sizeof(*a));
	const char *profile = o && o->profile ? o->profile : kiln__env("AWS_PROFILE");
	int named = profile != NULL;
	if (!profile)
		profile = "default";
	char *cpath = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
	char *fpath = home_file("AWS_CONFIG_FILE", ".aws/config");
	char *creds = cpath ? slurp(cpath) : NULL;
	char *conf = fpath ? slurp(fpath) : NULL;
	char *csect = NULL;
	if (!strcmp(profile, "default"))
		csect = strdup("default");
	else if (asprintf(&csect, "profile %s", profile) < 0)
		csect = NULL;
	int rc = 0;
	if (!csect) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	if (kiln__env("AWS_ACCESS_KEY_ID") && kiln__env("AWS_SECRET_ACCESS_KEY")) {
		a->access = strdup(kiln__env("AWS_ACCESS_KEY_ID"));
		a->secret = strdup(kiln__env("AWS_SECRET_ACCESS_KEY"));
		a->token = dup_opt(kiln__env("AWS_SESSION_TOKEN"));
	}
	keys_from(a, creds, profile);
	keys_from(a, conf, csect);
	if ((a->access != NULL) != (a->secret != NULL)) {
		rc = kiln__fail_inval(err, KILN_NO_INDEX, "credentials",
				      "profile %s has an access key without a secret key or the "
				      "other way round",
				      profile);
		goto out;
	}
	a->region = dup_opt(o && o->region ? o->region : kiln__env("AWS_REGION"));
	if (!a->region)
		a->region = dup_opt(kiln__env("AWS_DEFAULT_REGION"));
	if (!a->region && conf)
		a->region = kiln__aws_ini_value(conf, csect, "region", NULL);
	a->endpoint = dup_opt(o && o->endpoint ? o->endpoint : kiln__env("AWS_ENDPOINT_URL_S3"));
	if (!a->endpoint)
		a->endpoint = dup_opt(kiln__env("AWS_ENDPOINT_URL"));
	if (!a->endpoint && conf)
		a->endpoint = kiln__aws_ini_value(conf, csect, "endpoint_url", NULL);
	if (named && !a->access && !kiln__env("AWS_ACCESS_KEY_ID") &&
	    !has_section(creds, profile) && !has_section(conf, csect)) {
		rc = kiln__fail_inval(
		    err, KILN_NO_INDEX, "profile", "the AWS profile %s is in neither %s nor %s",
		    profile, cpath ? cpath : "~/.aws/credentials", fpath ? fpath : "~/.aws/config");
		goto out;
	}
	if (!a->region)
		a->region = strdup("us-east-1");
	if (!a->region)
		rc = kiln__nomem(err, 0, NULL);
out:
	if (creds) {
		explicit_bzero(creds, strlen(creds));
		free(creds);
	}
	if (conf) {
		explicit_bzero(conf, strlen(conf));
		free(conf);
	}
	free(cpath);
	free(fpath);
	free(csect);
	if (rc)
		kiln__aws_free(a);
	return rc;
}
