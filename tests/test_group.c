/* SPDX-License-Identifier: MIT */
/*
 * Read once per group (kiln_group_load) with an in-process collective: one thread per rank,
 * each with its own copy of the file and its own model, exchanging through a barrier. Every rank
 * ends with every byte; the ranks' reads add up to the payload once; different files are found
 * before any exchange; a rank whose read fails, or a collective that fails, ends every rank
 * with an error.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define NT    30
#define WMAX  4
#define CHUNK (64u << 10)

static uint8_t *data[NT];
static kiln_tensor_spec spec[NT];
static blob file;

static uint64_t size_of(int i)
{
	static const uint64_t s[] = {0, 5, 70001, 200000, 3, (1u << 20) + 9};
	return s[i % 6];
}

static void make_data(void)
{
	uint64_t x = 5;
	for (int i = 0; i < NT; i++) {
		uint64_t n = size_of(i);
		data[i] = malloc(n ? n : 1);
		fill_random(data[i], n, &x);
		spec[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {n}, .data = data[i]};
	}
	file = build(spec, NT);
}

static void drop_data(void)
{
	blob_free(&file);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

TestSuite(group, .init = make_data, .fini = drop_data);

/* --- the collective: a barrier and a shared board -------------------------------------------- */

struct board {
	pthread_barrier_t bar;
	uint8_t *slots;
	size_t cap;
	uint32_t world;
	int fail_call;  /* the call (1, 2, ...) at which every rank's all_gather fails; 0: never */
	int damage;     /* rank 1 receives rank 0's part of the second call with a byte flipped */
	uint32_t flags; /* kiln_group_options.flags of every rank */
	int digests;    /* every copy has a sidecar, opened with KILN_OPEN_VERIFY_DIGESTS */
};

struct rank {
	struct board *b;
	uint32_t rank;
	int calls;
	const char *path;        /* its own copy */
	int truncate_after_open; /* this rank's copy loses its payload once opened */
	const uint64_t *list;
	size_t count;
	int rc;
	kiln_error err;
	kiln_group_result res;
	kiln_model_info info; /* of its model after the load */
	void *dests[NT];
};

static int all_gather(void *ctx, const void *mine, void *all, size_t len, kiln_error *err)
{
	struct rank *r = ctx;
	struct board *b = r->b;
	if (++r->calls == b->fail_call)
		return kiln_error_set(err, KILN_IO, ECONNRESET, "test collective: call %d fails",
				      r->calls);
	cr_assert_leq(len * b->world, b->cap);
	memcpy(b->slots + r->rank * len, mine, len);
	pthread_barrier_wait(&b->bar);
	memcpy(all, b->slots, len * b->world);
	if (b->damage && r->rank == 1 && r->calls == 2)
		((uint8_t *)all)[len / 2] ^= 1;
	pthread_barrier_wait(&b->bar);
	return 0;
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;
	kiln_model *m;
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_DIRECTORY_ONLY};
	if (r->b->digests)
		o.flags |= KILN_OPEN_VERIFY_DIGESTS;
	if (kiln_model_open(r->path, &o, &m, &r->err)) {
		r->rc = -1;
		return NULL;
	}
	if (r->truncate_after_open)
		cr_assert_eq(truncate(r->path, 4096), 0);
	size_t n = r->list ? r->count : NT;
	for (size_t k = 0; k < n; k++) {
		uint64_t i = r->list ? r->list[k] : k;
		r->dests[k] = calloc(1, size_of((int)i) + 1);
	}
	kiln_collective c = {.size = sizeof(c),
			     .rank = r->rank,
			     .world = r->b->world,
			     .ctx = r,
			     .all_gather = all_gather};
	kiln_group_options go = {.size = sizeof(go), .chunk_size = CHUNK, .flags = r->b->flags};
	r->rc = kiln_group_load(m, r->list, r->count, r->dests, &c, &go, &r->res, &r->err);
	kiln_model_get_info(m, &r->info);
	kiln_model_close(m);
	return NULL;
}

/* Run b->world ranks of the board b, each on its own copy of the file (rank `odd` gets `other`
 * when set). With b->digests each copy gets a sidecar of 4 KiB chunks first, and then, when
 * flip_at is set, rank odd's copy a byte changed at flip_at (after its digests were made). */
static void run_board(struct board *b, struct rank *rs, const uint64_t *list, size_t count,
		      const blob *other, uint32_t odd, uint64_t flip_at)
{
	uint32_t world = b->world;
	b->cap = (size_t)world * (CHUNK + 4096);
	b->slots = malloc(b->cap);
	pthread_barrier_init(&b->bar, NULL, world);
	pthread_t th[WMAX];
	for (uint32_t q = 0; q < world; q++) {
		const blob *f = other && q == odd ? other : &file;
		rs[q] = (struct rank){.b = b, .rank = q, .list = list, .count = count};
		rs[q].path = write_temp(f->p, f->len);
		if (!b->digests)
			continue;
		kiln_model *m;
		kiln_error err;
		cr_assert_eq(kiln_model_open(rs[q].path, NULL, &m, &err), 0, "%s", err.message);
		kiln_digest_options o = {
		    .size = sizeof(o), .chunk_log2 = 12, .flags = KILN_WRITE_NO_SYNC};
		cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), 0, "%s", err.message);
		kiln_model_close(m);
		if (q == odd && flip_at) {
			size_t n;
			uint8_t *bytes = slurp(rs[q].path, &n);
			bytes[flip_at] ^= 0x10;
			put_file(rs[q].path, bytes, n);
			free(bytes);
		}
	}
	for (uint32_t q = 0; q < world; q++)
		pthread_create(&th[q], NULL, rank_main, &rs[q]);
	for (uint32_t q = 0; q < world; q++)
		pthread_join(th[q], NULL);
	for (uint32_t q = 0; q < world; q++) {
		if (b->digests) {
			char *side;
			cr_assert(asprintf(&side, "%s.kiln-digest", rs[q].path) > 0);
			unlink(side);
			free(side);
		}
		unlink(rs[q].path);
		free((void *)rs[q].path);
	}
	pthread_barrier_destroy(&b->bar);
	free(b->slots);
}

/* Run `world` ranks, each on its own copy of the file (rank `odd` gets `other` when set). */
static void run_with(struct rank *rs, uint32_t world, const uint64_t *list, size_t count,
		     const blob *other, uint32_t odd, int fail_call, int damage, uint32_t flags)
{
	struct board b = {.world = world, .fail_call = fail_call, .damage = damage, .flags = flags};
	run_board(&b, rs, list, count, other, odd, 0);
}

static void run(struct rank *rs, uint32_t world, const uint64_t *list, size_t count,
		const blob *other, uint32_t odd, int fail_call)
{
	run_with(rs, world, list, count, other, odd, fail_call, 0, 0);
}

static void free_dests(struct rank *rs, uint32_t world, size_t n)
{
	for (uint32_t q = 0; q < world; q++)
		for (size_t k = 0; k < n; k++)
			free(rs[q].dests[k]);
}

Test(group, every_rank_gets_every_byte_read_once)
{
	uint64_t total = 0;
	for (int i = 0; i < NT; i++)
		total += size_of(i);
	for (uint32_t world = 1; world <= WMAX; world++) {
		struct rank rs[WMAX];
		run(rs, world, NULL, 0, NULL, 0, 0);
		uint64_t read = 0;
		for (uint32_t q = 0; q < world; q++) {
			cr_assert_eq(rs[q].rc, 0, "world %u rank %u: %s", world, q,
				     rs[q].err.message);
			for (int i = 0; i < NT; i++)
				cr_assert_eq(memcmp(rs[q].dests[i], data[i], size_of(i)), 0,
					     "world %u rank %u tensor %d", world, q, i);
			cr_assert_eq(rs[q].res.bytes_read + rs[q].res.bytes_received, total);
			/* A sample of what it received, at most 4 KiB a chunk, compared. */
			if (world == 1)
				cr_assert_eq(rs[q].res.bytes_verified, 0);
			else
				cr_assert(rs[q].res.bytes_verified > 0 &&
					  rs[q].res.bytes_verified <= rs[q].res.bytes_received);
			cr_assert_leq(rs[q].res.staging_bytes,
				      (uint64_t)(world + 2) * (CHUNK + 256));
			read += rs[q].res.bytes_read;
		}
		cr_assert_eq(read, total, "world %u: the group read %llu of %llu bytes", world,
			     (unsigned long long)read, (unsigned long long)total);
		/* Balanced by bytes: no rank reads more than its share plus a chunk. */
		for (uint32_t q = 0; q < world; q++)
			cr_assert_leq(rs[q].res.bytes_read, total / world + CHUNK);
		free_dests(rs, world, NT);
	}
}

Test(group, a_list_in_its_own_order)
{
	const uint64_t list[] = {29, 5, 11, 0, 17, 5};
	struct rank rs[3];
	run(rs, 3, list, 6, NULL, 0, 0);
	for (uint32_t q = 0; q < 3; q++) {
		cr_assert_eq(rs[q].rc, 0, "%s", rs[q].err.message);
		for (size_t k = 0; k < 6; k++)
			cr_assert_eq(memcmp(rs[q].dests[k], data[list[k]], size_of((int)list[k])),
				     0);
	}
	free_dests(rs, 3, 6);
}

Test(group, different_files_are_found_before_any_exchange)
{
	/* Rank 2's copy has one tensor one byte longer: its sizes and directory differ. */
	uint64_t keep = spec[3].shape[0];
	spec[3].shape[0] = keep - 1;
	blob other = build(spec, NT);
	spec[3].shape[0] = keep;
	struct rank rs[3];
	run(rs, 3, NULL, 0, &other, 2, 0);
	for (uint32_t q = 0; q < 3; q++) {
		cr_assert_eq(rs[q].rc, KILN_INVAL, "rank %u: %s", q, rs[q].err.message);
		cr_assert(strstr(rs[q].err.message, "rank 2 opened a different model from rank 0"),
			  "%s", rs[q].err.message);
		cr_assert_eq(rs[q].res.bytes_read, 0, "nothing read before the check");
	}
	free_dests(rs, 3, NT);
	/* The same bytes, a different list on one rank: the list differs. */
	blob_free(&other);
}

Test(group, a_failing_rank_fails_every_rank)
{
	struct board b;
	(void)b;
	struct rank rs[3];
	/* Rank 1's copy is cut after it opened: its first read fails with EIO. */
	struct board bd = {.world = 3};
	bd.cap = 3 * (CHUNK + 4096);
	bd.slots = malloc(bd.cap);
	pthread_barrier_init(&bd.bar, NULL, 3);
	pthread_t th[3];
	for (uint32_t q = 0; q < 3; q++) {
		rs[q] = (struct rank){.b = &bd, .rank = q, .truncate_after_open = q == 1};
		rs[q].path = write_temp(file.p, file.len);
	}
	for (uint32_t q = 0; q < 3; q++)
		pthread_create(&th[q], NULL, rank_main, &rs[q]);
	for (uint32_t q = 0; q < 3; q++)
		pthread_join(th[q], NULL);
	cr_assert_eq(rs[1].rc, KILN_IO, "%s", rs[1].err.message);
	for (uint32_t q = 0; q < 3; q++) {
		cr_assert_neq(rs[q].rc, 0);
		if (q != 1)
			cr_assert(strstr(rs[q].err.message, "rank 1 failed"), "rank %u: %s", q,
				  rs[q].err.message);
		unlink(rs[q].path);
		free((void *)rs[q].path);
	}
	pthread_barrier_destroy(&bd.bar);
	free(bd.slots);
	free_dests(rs, 3, NT);
}

Test(group, a_failing_collective_is_the_error)
{
	struct rank rs[2];
	run(rs, 2, NULL, 0, NULL, 0, 3);
	for (uint32_t q = 0; q < 2; q++) {
		cr_assert_eq(rs[q].rc, KILN_IO);
		cr_assert(strstr(rs[q].err.message, "call 3 fails"), "%s", rs[q].err.message);
		cr_assert_eq(rs[q].err.sys_errno, ECONNRESET);
	}
	free_dests(rs, 2, NT);
}

Test(group, arguments_checked)
{
	char *p = write_temp(file.p, file.len);
	kiln_model *m;
	cr_assert_eq(kiln_model_open(p, NULL, &m, NULL), 0);
	void *dests[NT] = {0};
	kiln_error err;
	kiln_collective c = {.size = sizeof(c), .rank = 2, .world = 2, .all_gather = all_gather};
	cr_assert_eq(kiln_group_load(m, NULL, 0, dests, &c, NULL, NULL, &err), KILN_INVAL);
	c.rank = 0;
	c.all_gather = NULL;
	cr_assert_eq(kiln_group_load(m, NULL, 0, dests, &c, NULL, NULL, &err), KILN_INVAL);
	c.all_gather = all_gather;
	kiln_group_options o = {.size = sizeof(o), .flags = 8};
	cr_assert_eq(kiln_group_load(m, NULL, 0, dests, &c, &o, NULL, &err), KILN_INVAL);
	/* A NULL destination for a tensor with bytes. */
	c.world = 1;
	cr_assert_eq(kiln_group_load(m, NULL, 0, dests, &c, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, 1);
	kiln_model_close(m);
	unlink(p);
	free(p);
}

/* Every rank failed with `code`, naming tensor `tensor` in a message holding `want`. */
static void all_failed(struct rank *rs, uint32_t world, int code, uint64_t tensor, const char *want)
{
	for (uint32_t q = 0; q < world; q++) {
		cr_assert_eq(rs[q].rc, code, "rank %u: %s: %s", q, kiln_code_name(rs[q].rc),
			     rs[q].err.message);
		cr_assert(strstr(rs[q].err.message, want), "rank %u: %s", q, rs[q].err.message);
		cr_assert_eq(rs[q].err.tensor, tensor, "rank %u: %s", q, rs[q].err.message);
	}
}

/* A copy of the file, its header unchanged, with bytes [from, from + len) of tensor i flipped. */
static blob altered(uint64_t i, uint64_t from, uint64_t len)
{
	blob other = {malloc(file.len), file.len};
	memcpy(other.p, file.p, file.len);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_parse(file.p, file.len, NULL, &m, &err), 0);
	const kiln_tensor *t = kiln_model_tensor(m, i);
	cr_assert_leq(from + len, t->byte_length);
	for (uint64_t k = from; k < from + len; k++)
		other.p[t->file_offset + k] ^= 0xA5;
	kiln_model_close(m);
	return other;
}

/* Two checkpoints with the same header (every name, dtype, shape and offset) and other bytes:
 * each rank would get half of each. The samples of the first round find it; every rank fails
 * naming the first tensor that differs, and where. */
Test(group, headers_alike_payloads_not)
{
	blob other = altered(5, 0, size_of(5)); /* all of its 1 MiB + 9 bytes */
	struct rank rs[3];
	run(rs, 3, NULL, 0, &other, 1, 0);
	all_failed(rs, 3, KILN_INVAL, 5, "the ranks opened different checkpoints");
	free_dests(rs, 3, NT);
	blob_free(&other);
}

/* One byte of a 1 MiB tensor differs: the samples (256 bytes of each tensor in a chunk) may miss
 * it, comparing every byte (KILN_GROUP_VERIFY_ALL) does not, and names the byte. */
Test(group, verify_all_finds_one_byte)
{
	blob other = altered(11, 777777, 1);
	struct rank rs[2];
	run_with(rs, 2, NULL, 0, &other, 1, 0, 0, KILN_GROUP_VERIFY_ALL);
	all_failed(rs, 2, KILN_INVAL, 11,
		   "differ from this rank's file at byte 777777 of the tensor");
	free_dests(rs, 2, NT);
	blob_free(&other);
	/* The same files: every byte compared, and all agree. */
	run_with(rs, 2, NULL, 0, NULL, 0, 0, 0, KILN_GROUP_VERIFY_ALL);
	for (uint32_t q = 0; q < 2; q++) {
		cr_assert_eq(rs[q].rc, 0, "%s", rs[q].err.message);
		cr_assert_eq(rs[q].res.bytes_verified, rs[q].res.bytes_received);
	}
	free_dests(rs, 2, NT);
}

/* A collective that damages a byte on its way to one rank: that rank finds it by the chunk's
 * digest, and every rank fails (the others at the next exchange). */
Test(group, a_damaged_exchange_fails_every_rank)
{
	struct rank rs[2];
	run_with(rs, 2, NULL, 0, NULL, 0, 0, 1, 0);
	cr_assert_eq(rs[1].rc, KILN_IO, "%s", rs[1].err.message);
	cr_assert_eq(rs[1].err.sys_errno, EBADMSG);
	cr_assert(strstr(rs[1].err.message, "rank 0's chunk at payload byte 0 arrived damaged"),
		  "%s", rs[1].err.message);
	cr_assert_neq(rs[0].rc, 0);
	cr_assert(strstr(rs[0].err.message, "rank 1 failed"), "%s", rs[0].err.message);
	free_dests(rs, 2, NT);
}

/* --- with digests: every rank checks what it reads and what it receives ---------------------- */

/* Each rank on its own copy with a sidecar of 4 KiB chunks (rank `odd` gets `other`, with a
 * sidecar of its own, when set; then, when flip_at is set, that copy has byte flip_at changed
 * after its sidecar was made), every one opened directory-only with KILN_OPEN_VERIFY_DIGESTS. */
static void run_checked(struct rank *rs, uint32_t world, const blob *other, uint32_t odd,
			uint64_t flip_at)
{
	struct board b = {.world = world, .digests = 1};
	run_board(&b, rs, NULL, 0, other, odd, flip_at);
}

/* Clean copies: every byte arrives, every received byte is checked against the receiver's own
 * digests (counted in bytes_verified: at least what was received); a rank hashes what it reads
 * and receives and at most one 4 KiB chunk more at each end of every 64 KiB share (the list
 * is the file's tensors in order: a share is one run of the file but for pads). */
Test(group, with_digests_every_received_byte_is_checked)
{
	struct rank rs[3];
	run_checked(rs, 3, NULL, 0, 0);
	uint64_t total = 0;
	for (int i = 0; i < NT; i++)
		total += size_of(i);
	uint64_t shares = (total + CHUNK - 1) / CHUNK;
	for (uint32_t q = 0; q < 3; q++) {
		cr_assert_eq(rs[q].rc, 0, "rank %u: %s", q, rs[q].err.message);
		cr_assert_geq(rs[q].res.bytes_verified, rs[q].res.bytes_received, "rank %u", q);
		cr_assert_eq(rs[q].res.bytes_read + rs[q].res.bytes_received, total);
		cr_assert_geq(rs[q].info.digest_bytes, total, "rank %u", q);
		cr_assert_leq(rs[q].info.digest_bytes, total + shares * 2 * 4096,
			      "rank %u: %" PRIu64, q, rs[q].info.digest_bytes);
		cr_assert_gt(rs[q].res.bytes_received, 0);
		for (int i = 0; i < NT; i++)
			cr_assert_eq(memcmp(rs[q].dests[i], data[i], size_of(i)), 0, "rank %u", q);
	}
	free_dests(rs, 3, NT);
}

/* One byte of a 1 MiB tensor differs in one rank's file (with digests of its own): a receiver
 * finds it in what it receives, by its digests, with no sampling; every rank fails. */
Test(group, with_digests_a_rank_of_another_file_is_found)
{
	blob other = altered(11, 777777, 1);
	struct rank rs[2];
	run_checked(rs, 2, &other, 1, 0);
	int found = 0;
	for (uint32_t q = 0; q < 2; q++) {
		cr_assert_neq(rs[q].rc, 0, "rank %u", q);
		found |= rs[q].rc == KILN_CORRUPT && rs[q].err.tensor == 11 &&
			 strstr(rs[q].err.message, "a chunk received from another rank");
	}
	cr_assert(found, "%s / %s", rs[0].err.message, rs[1].err.message);
	free_dests(rs, 2, NT);
	blob_free(&other);
}

/* A byte of one rank's copy rots after its digests were made. When that rank reads the chunk
 * holding it, its own read finds it (CORRUPT naming the tensor) and every rank fails; when the
 * other rank reads that chunk, nobody reads the rotten byte, and the checked bytes received
 * from the other rank are right: every rank succeeds. */
Test(group, with_digests_a_rank_finds_its_own_rot)
{
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_parse(file.p, file.len, NULL, &m, &err), 0);
	const kiln_tensor *t = kiln_model_tensor(m, 5);
	uint64_t at = t->file_offset + 1000, pos = 1000;
	kiln_model_close(m);
	for (int i = 0; i < 5; i++)
		pos += size_of(i);
	uint32_t reader = (uint32_t)(pos / CHUNK % 2);
	struct rank rs[2];
	run_checked(rs, 2, &file, reader, at);
	for (uint32_t q = 0; q < 2; q++)
		cr_assert_neq(rs[q].rc, 0, "rank %u", q);
	cr_assert_eq(rs[reader].rc, KILN_CORRUPT, "%s", rs[reader].err.message);
	cr_assert_eq(rs[reader].err.tensor, 5, "%s", rs[reader].err.message);
	cr_assert(strstr(rs[reader].err.message, "differs from its digest"), "%s",
		  rs[reader].err.message);
	free_dests(rs, 2, NT);
	run_checked(rs, 2, &file, 1 - reader, at);
	for (uint32_t q = 0; q < 2; q++) {
		cr_assert_eq(rs[q].rc, 0, "rank %u: %s", q, rs[q].err.message);
		cr_assert_eq(memcmp(rs[q].dests[5], data[5], size_of(5)), 0, "rank %u", q);
	}
	free_dests(rs, 2, NT);
}
