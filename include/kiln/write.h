/* SPDX-License-Identifier: MIT */
/*
 * kiln/write.h: writing (included by kiln/kiln.h): the canonical KLNT layout (spec section 7),
 * series of any size, safetensors byte for byte as its reference writes it, and any file
 * published atomically the same way.
 */
#ifndef KILN_WRITE_H
#define KILN_WRITE_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Payload producer for kiln_tensor_spec.read: copy bytes [offset, offset + len) of the tensor's
 * payload into buf. Return 0 on success, ECANCELED to stop the write (kiln returns CANCELED), or
 * another errno value (kiln reports it as IO).
 */
typedef int (*kiln_payload_fn)(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len);

/*
 * One tensor to write. Zero-initialise and fill what applies.
 * - name: NULL for unnamed. Either every tensor is named or none is (TYPE otherwise).
 * - shape[0..rank). Slots past rank must be 0.
 * - byte_length: for opaque dtypes the payload length (a multiple of block_size); for the others
 *   it may be 0 (computed) or must equal the computed length.
 * - quant: the fields are read only when quant_scheme is 1 or 2; outer_index only for scheme 2.
 *   Others are written as "none".
 * - payload: `data` (byte_length bytes), or `read` called with ascending chunks, or neither for
 *   a zero-length payload. `data` wins when both are set.
 */
typedef struct kiln_tensor_spec {
	const char *name;
	size_t name_len;
	uint16_t dtype;
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK];
	const char *layout;
	size_t layout_len;
	uint32_t block_size;
	uint16_t quant_scheme;
	uint16_t quant_axis;
	uint32_t group_size;
	uint32_t scale_index;
	uint32_t outer_index;
	uint64_t byte_length;
	const void *data;
	kiln_payload_fn read;
	void *read_ctx;
} kiln_tensor_spec;

enum kiln_write_flags {
	/* Skip fsync() of the new file and of its directory (faster, not crash safe). */
	KILN_WRITE_NO_SYNC = 1u << 0,
	/* Write the tensors alone, without the file's digest table (kiln/verify.h,
	 * KILN_DIGESTS_TENSOR): the file then holds exactly the tensors given, as
	 * kiln_write_memory() and kiln_safetensors_write_memory() always write them. */
	KILN_WRITE_NO_DIGESTS = 1u << 1,
};

/*
 * Check a tensor list as the reader would and compute the block length. Returns 0 or the class
 * the reader would give the block (FRAME/TYPE/LIMIT/UTF8), with the descriptor index and field;
 * INVAL for bad arguments. Payload bytes are not looked at here.
 */
KILN_API int kiln_write_size(const kiln_tensor_spec *tensors, uint32_t count,
			     uint64_t *block_length, kiln_error *err);

/*
 * Write the block into buf[0..cap). On success *written is the block length. LIMIT when cap is
 * too small (nothing useful is left in buf). Also checks the 4-bit padding of payloads.
 */
KILN_API int kiln_write_memory(const kiln_tensor_spec *tensors, uint32_t count, void *buf,
			       size_t cap, size_t *written, kiln_error *err);

/*
 * Write the block to `path`, replacing whatever file is there, so that a reader never sees a
 * partial file and a reader that has the old file mapped keeps its pages. Payloads are streamed
 * in chunks of at most 1 MiB, never held whole. `flags` is a mask of enum kiln_write_flags.
 *
 * Named tensors are followed by the file's digest table (kiln/verify.h), hashed as the bytes go
 * out: one more u8 tensor, KILN_DIGESTS_TENSOR, last, which kiln leaves out of the model it
 * opens and checks when asked (KILN_OPEN_VERIFY_DIGESTS, kiln_model_verify_digests()). A tensor
 * of the caller's so named is then TYPE. KILN_WRITE_NO_DIGESTS (and unnamed tensors, which
 * have no place for one) write the tensors alone: the block kiln_write_memory() writes.
 *
 * How: the new file is written and fsync'ed in the directory of the file it replaces, rename()d
 * over that file, and the directory is fsync'ed so that the new name survives a crash. Where the
 * file system supports O_TMPFILE (and /proc is mounted) the new file has no name while it is
 * written, so a crash, a kill or a signal leaves nothing behind; to replace an existing file it
 * gets a hidden name beside it, once complete, just before the rename. Elsewhere it is written
 * under a hidden ".kiln-tmp." name with 64 random bits, which a crash can leave behind but which
 * nobody can predict, so creating names in advance cannot block a write.
 *
 * Symlinks are followed, as editors do: when `path` is a symlink (or a chain of them), the file
 * it points to is replaced and the link stays a link; a dangling link names the file to create.
 * As the kernel's protected_symlinks rule does, a link in a sticky world-writable directory (such
 * as /tmp) is not followed unless the caller or the directory's owner owns it (IO, EACCES).
 * A replaced file keeps its permission bits (including set-user/group-ID bits), and its owner and
 * group where the caller may set them (as root; a group the caller belongs to); ACLs, extended
 * attributes and other hard links to the old file are not carried over. A new file gets
 * 0666 & ~umask. A directory, device, FIFO or socket at `path` is not replaced (IO, EISDIR or
 * EINVAL).
 *
 * Returns:
 * - 0: the new file is in place and, unless KILN_WRITE_NO_SYNC, durable;
 * - UNSYNCED (only without KILN_WRITE_NO_SYNC): the new file is in place and complete, but its
 *   directory could not be opened or fsync'ed (sys_errno says why; a directory that is writable
 *   but not readable cannot be opened): a crash may still lose the rename and bring back the old
 *   file. Every code below leaves `path` as it was;
 * - FRAME, TYPE, LIMIT, UTF8: the tensors break a rule (as kiln_write_size, or the 4-bit padding
 *   of a payload), INVAL for bad arguments or a payload with no source, NOMEM;
 * - CANCELED: a read callback returned ECANCELED;
 * - IO with sys_errno: a callback failed (its errno), or a system call did; the message names the
 *   path and the step (looking at the target, following the symlink, opening the directory,
 *   creating the temporary file, setting its mode, write, fsync, close, link, rename).
 * No temporary file outlives the call, unless the process dies in it on a file system without
 * O_TMPFILE.
 */
KILN_API int kiln_write_file(const char *path, const kiln_tensor_spec *tensors, uint32_t count,
			     uint32_t flags, kiln_error *err);

/*
 * Write any file to `path` the way kiln_write_file() writes a block: `fill` writes the contents
 * through `fd` (a new, empty regular file opened for writing at offset 0; write or pwrite it, do
 * not close it) and returns 0, or a nonzero kiln_code with *err filled (kiln_error_set()) to stop:
 * the file is then never visible and no temporary file is left. A fill that returns nonzero
 * without filling *err gets a generic message; a negative return is reported as IO. `ctx` is
 * passed through. Everything else is kiln_write_file()'s contract: the new file is created,
 * fsync'ed and renamed into place as described there (O_TMPFILE or a random hidden name, symlinks
 * followed, mode and owner of a replaced file kept, the directory fsync'ed), `flags` is a mask of
 * enum kiln_write_flags.
 *
 * Returns 0 or UNSYNCED as kiln_write_file(); the fill's code (with its *err) when it stops;
 * INVAL for a NULL path or fill or an unknown flag; IO with sys_errno for a system call, the
 * message naming the path and the step. Every code but 0 and UNSYNCED leaves `path` as it was.
 */
KILN_API int kiln_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err),
			       void *ctx, uint32_t flags, kiln_error *err);

/*
 * KLNT output of any size. kiln_write_file() writes one file, whose name heap (16-bit offsets)
 * holds some 64 KiB of names: 1,400 to 3,500 tensors of usual names. kiln_write_series() writes
 * `path` as one file when the tensors fit, and otherwise (or when a shard's payload would pass
 * max_shard_size) a series STEM-00001-of-0000N.klnt beside it (STEM: path without ".klnt"),
 * which kiln_model_open() of any shard opens whole. The shards are planned before a byte is
 * written (in the caller's order, each quantization group, a tensor with its scale and outer
 * tensors, kept in one shard; links are indices in `tensors`), each is proven writable, then
 * written under a hidden, unpredictable name beside its final one and all are renamed into place
 * at the end: a failure or an interruption before that last step leaves an earlier output of the
 * same path whole (a rename failing in it, or a crash between renames, can leave part of the new
 * series in place; the error says how many shards were). One file is published as
 * kiln_write_file() publishes. After a successful write, what an earlier write to `path` left
 * that this one did not replace is removed (a series of another count, `path` itself when a
 * series was written, a series when one file was): only regular files that open as KLNT, never
 * a file of opts->keep. A write that would leave such a file beside a new series of another
 * count (readers would find two series) is refused before it starts.
 *
 * Tensors are kiln_tensor_spec as kiln_write_file() takes them; `read` gets the tensor's index
 * in `tensors`. Unnamed tensors can only be written as one file. Every file ends with its own
 * digest table, as kiln_write_file() writes it (not counted against max_shard_size: 16 bytes a
 * MiB), unless opts->flags has KILN_WRITE_NO_DIGESTS.
 *
 * Returns 0; UNSYNCED (everything in place, a directory not synced); INVAL for bad arguments, a
 * path with no file name or named like a shard (readers would look for the rest of its series),
 * unnamed tensors that need a series or come with a metadata document, an output that would
 * replace a file of opts->keep, an earlier series that would stay beside the new one; IO when a
 * shard's name holds something that is not a regular file; LIMIT past 99,999 shards;
 * the classes of kiln_write_size() for tensors that break a rule (tensor: the index in
 * `tensors`), and kiln_write_file()'s codes. Nothing is left behind on failure.
 */
typedef struct kiln_series_options {
	uint32_t size;           /* 0 or sizeof(kiln_series_options) */
	uint32_t flags;          /* enum kiln_write_flags, for every file */
	uint64_t max_shard_size; /* payload bytes per shard at most (0: as the names allow) */
	/* The converters' metadata document (docs/convert.md), written as the tensor
	 * KILN_METADATA_TENSOR, last in the first file; NULL for none (a tensor so named is then
	 * the caller's). */
	const void *metadata;
	size_t metadata_len;
	/* The files of this model are never replaced or removed (a conversion's sources). */
	const kiln_model *keep;
} kiln_series_options;

typedef struct kiln_series_result {
	uint32_t files;   /* 1, or the shards of the series */
	uint32_t removed; /* files of an earlier write to the path removed */
	char first[4096]; /* the path of the (first) file */
} kiln_series_result;

KILN_API int kiln_write_series(const char *path, const kiln_tensor_spec *tensors, uint64_t count,
			       const kiln_series_options *opts, kiln_series_result *res,
			       kiln_error *err);

/* One __metadata__ entry of a safetensors file: UTF-8 key and value (not NUL-terminated). */
typedef struct kiln_str_pair {
	const char *key;
	size_t key_len;
	const char *value;
	size_t value_len;
} kiln_str_pair;

/*
 * safetensors files, laid out byte for byte as the reference writer (Hugging Face's safetensors,
 * `serialize`) lays out the same tensors: the 8-byte little-endian header length; the JSON header
 * with no whitespace, `"__metadata__"` first when `metadata` is not NULL (its entries in key
 * order: the reference writes them in hash-table order, so with two keys or more any order is
 * one it could write, and kiln's is the deterministic one), then one entry per tensor,
 * `"NAME":{"dtype":"F32","shape":[2,2],"data_offsets":[BEGIN,END]}`, in the reference's order:
 * by dtype, widest first (U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8_E5M2FNUZ F8_E4M3FNUZ
 * F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 F6_E3M2 F6_E2M3 F4 BOOL), then by name (bytewise); strings
 * escaped as serde_json escapes them (\" \\ \b \f \n \r \t, other bytes below 0x20 as \u00xx,
 * everything else as it is); the header padded with spaces to a multiple of 8; then the payloads
 * back to back in that order.
 *
 * A tensor is a kiln_tensor_spec: name (every tensor has one: UTF-8, unique, not
 * "__metadata__"), dtype (one safetensors has: kiln_safetensors_dtype_code(); the opaque ones with
 * the string as layout), rank and shape (slots past rank 0), byte_length equal to the shape's
 * elements times the dtype's bits / 8 (whole bytes), and data or read as kiln_write_file() takes
 * them (read's tensor argument is the index in `tensors`). The quant fields and block_size must be
 * 0: safetensors has no place for them. `metadata` is NULL for no __metadata__ (an empty one is
 * a non-NULL pointer with nmeta 0); keys unique, keys and values UTF-8.
 *
 * Errors as the reader would give the file (src/safetensors.c), naming the tensor by its index in
 * `tensors`: UTF8 (a name, key or value), TYPE (a duplicate name or key, a dtype safetensors lacks,
 * a byte length the shape contradicts, elements that are not whole bytes, the name __metadata__),
 * LIMIT (a header above the reference's 100,000,000 bytes, a shape that overflows); INVAL for bad
 * arguments (a missing name, quant fields set, NULL arrays with nonzero counts), NOMEM.
 */
/* The length of the whole file in *file_length. */
KILN_API int kiln_safetensors_size(const kiln_tensor_spec *tensors, size_t count,
				   const kiln_str_pair *metadata, size_t nmeta,
				   uint64_t *file_length, kiln_error *err);
/* The file into buf[0, cap); *written is its length. LIMIT when cap is too small. */
KILN_API int kiln_safetensors_write_memory(const kiln_tensor_spec *tensors, size_t count,
					   const kiln_str_pair *metadata, size_t nmeta, void *buf,
					   size_t cap, size_t *written, kiln_error *err);
/* The file to `path`, published as kiln_write_file() publishes (atomic replace, fsync unless
 * KILN_WRITE_NO_SYNC, no partial file ever visible); its return codes. Payloads in `data` go to
 * write() as they are; those from `read` through a 1 MiB buffer. Unless flags has
 * KILN_WRITE_NO_DIGESTS, __metadata__ gains the file's digest table (kiln/verify.h:
 * KILN_DIGESTS_KEY, base64, covering the data region; a key of the caller's so named is TYPE),
 * hashed as the data goes out: the reference writer's bytes are the file with the flag, or
 * kiln_safetensors_write_memory(). */
KILN_API int kiln_safetensors_write_file(const char *path, const kiln_tensor_spec *tensors,
					 size_t count, const kiln_str_pair *metadata, size_t nmeta,
					 uint32_t flags, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KILN_WRITE_H */
