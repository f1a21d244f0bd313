/* SPDX-License-Identifier: MIT */
/* What the lifecycle of a model (src/model/model.c) offers the writers. */
#ifndef KILN_MODEL_MODEL_H
#define KILN_MODEL_MODEL_H

#include "base/base.h"

/* The writer's check: the KLNT reader over an encoded directory of `len` bytes that would be
 * written, with no payload behind it (a model of one borrowed buffer, never finished). */
int kiln__check_directory(const uint8_t *head, uint64_t len, kiln_error *err);

#endif
