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

#endif
