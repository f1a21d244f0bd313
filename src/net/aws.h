/* SPDX-License-Identifier: MIT */
/* AWS credentials and settings (src/net/aws.c). */
#ifndef KILN_NET_AWS_H
#define KILN_NET_AWS_H

#include "base/base.h"

/* What an s3:// request is made with; strings malloc'd, the secret wiped when freed. */
struct kiln__aws {
	char *access, *secret, *token, *region, *endpoint;
};

/* Credentials, region and endpoint as the AWS tools read them: `o` first, then the environment,
 * then the shared files of the profile. INVAL for an access key without its secret (or the
 * other way round) or a named profile that is nowhere; NOMEM. */
int kiln__aws_settings(const kiln_remote_options *o, struct kiln__aws *a, kiln_error *err);
void kiln__aws_free(struct kiln__aws *a);
/* The value of `key` (ASCII case ignored) in section `section` of an INI file of the AWS tools
 * (text NUL-terminated, at most KILN__AWS_FILE_MAX bytes; "#" and ";" start comments; keys and
 * values trimmed). *found_section (optional) is set when the section exists. NULL when absent;
 * malloc'ed otherwise. Exposed for its fuzz target (fuzz/fuzz_awsconfig.c). */
char *kiln__aws_ini_value(const char *text, const char *section, const char *key,
			  int *found_section);

#endif
