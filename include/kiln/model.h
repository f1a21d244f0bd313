/* SPDX-License-Identifier: MIT */
/*
 * kiln/model.h: opening a model in every way kiln can (included by kiln/kiln.h). Formats;
 * sources (how the bytes arrive: a mapping, owned memory read with pread or io_uring, a caller's
 * buffer, a URL) and the choice KILN_SOURCE_AUTO makes; open flags and options; lists of files,
 * buffers; payload verification; what a model and each of its files say about themselves.
 * docs/formats.md says what each format promises; README.md ("Loading") compares the sources.
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kiln_format {
	KILN_FORMAT_AUTO = 0, /* open: from the file's first bytes */
	KILN_FORMAT_KLNT = 1,
	KILN_FORMAT_GGUF = 2,
	KILN_FORMAT_SAFETENSORS = 3
};

/* "klnt", "gguf", "safetensors" ("auto" for 0), or NULL for an unknown code. */
KILN_API const char *kiln_format_name(unsigned format);

/* Where the bytes of a model live. */
enum kiln_source {
	KILN_SOURCE_MMAP = 0,   /* read-only shared mapping of each file (default for paths);
				 * copy-on-write with KILN_OPEN_PRIVATE */
	KILN_SOURCE_BUFFER = 1, /* the caller's buffer, borrowed (kiln_model_parse) */
	KILN_SOURCE_READ = 2,   /* each file read into owned memory with pread */
	KILN_SOURCE_URING = 3,  /* each file read into owned memory with io_uring */
	/* Paths only: kiln picks one of the above per file from cheap evidence (see
	 * kiln_auto_choice); kiln_model_info.source says which, auto_choice why. */
	KILN_SOURCE_AUTO = 4,
	/* Reported only (kiln_model_info.source): the file is a URL (s3://, http://, https://),
	 * its bytes fetched with ranged GETs (see kiln_remote_options). */
	KILN_SOURCE_REMOTE = 5
};

/*
 * What KILN_SOURCE_AUTO chose (kiln_model_info.auto_choice: the first file's; 0 when AUTO was
 * not asked for). The evidence: mincore() of 8 windows of 16 pages spread evenly from the
 * payload's start to the file's end (a payload of at most 128 pages is checked whole), right
 * after the file is mapped (a few microseconds), and MemAvailable from /proc/meminfo when that
 * matters. AUTO never picks O_DIRECT on its own: cold, it measured level with populating the
 * mapping, and it would leave the page cache cold for the next open too.
 */
enum kiln_auto_choice {
	KILN_AUTO_NONE = 0,
	KILN_AUTO_CACHED = 1,     /* MMAP + KILN_OPEN_POPULATE: the sampled pages were all in the
				   * page cache; mapping them all at open costs no disk read and beats
				   * faulting them in one by one later */
	KILN_AUTO_COLD = 2,       /* MMAP + KILN_OPEN_POPULATE: not all cached, and the file fits in
				   * half of MemAvailable, so one sequential pass at open is the fastest
				   * way in and every later touch is free */
	KILN_AUTO_LARGE = 3,      /* MMAP: not all cached and larger than half of MemAvailable;
				   * populating would evict its own first pages, so pages come in as the
				   * caller touches them */
	KILN_AUTO_UNMAPPABLE = 4, /* READ: the file system refused the mapping (ENODEV) */
	KILN_AUTO_OWNED = 5 /* URING: a load buffer or KILN_OPEN_DIRECT asked for owned bytes */
};

/* Name of a source ("mmap", "buffer", "read", "uring", "auto"), or NULL. */
KILN_API const char *kiln_source_name(unsigned source);

/* The model as a whole: its format, files, tensors, and how the bytes were loaded. */
typedef struct kiln_model_info {
	uint32_t format;          /* enum kiln_format */
	uint32_t files;           /* 1, or the shards of a series / the files of a list */
	uint64_t tensor_count;    /* in all files */
	uint64_t bytes;           /* the files' sizes added up */
	uint32_t source;          /* enum kiln_source the bytes came from */
	uint32_t auto_choice;     /* enum kiln_auto_choice: what KILN_SOURCE_AUTO chose, and why */
	uint8_t payload_verified; /* 1 once payload verification has passed */
	uint8_t direct;           /* 1 when every file was read with O_DIRECT */
	uint8_t digests_verified; /* 1: every byte was checked against its digests at open */
	uint8_t reserved8;
	/* Why a requested mode was not used (errno values, 0 when nothing fell back):
	 * direct_fallback: O_DIRECT was asked for but refused (EINVAL from the file system, or
	 * no direct I/O alignment), so buffered reads were used; uring_fallback: io_uring was
	 * asked for but unavailable (ENOSYS, EPERM in containers), so pread was used;
	 * advice_errno: a madvise hint the kernel refused (the mapping works without it). */
	int32_t direct_fallback;
	int32_t uring_fallback;
	int32_t advice_errno;
	uint32_t dio_align; /* file offset alignment used for O_DIRECT, 0 when not direct */
	uint32_t pinned;    /* ranges currently pinned with kiln_tensor_pin() */
	uint32_t realigned; /* tensors given an aligned owned copy (KILN_OPEN_ALIGN) */
	/* A URL's cache directory was there but not used (EPERM: not the user's own, or others
	 * may write to it), so the file was fetched uncached: kiln_cache_check() says why. */
	int32_t cache_refused;
	uint32_t reserved32;
	/* Chunks checked against their digests and their bytes: at open, and, for a directory-only
	 * open with KILN_OPEN_VERIFY_DIGESTS, by every read since (each read hashes the table
	 * chunks it touches: its bytes and at most one chunk more at each end of a contiguous
	 * range). */
	uint64_t digest_chunks;
	uint64_t digest_bytes;
} kiln_model_info;

/* One file of a model: what its header says and where its payloads are. */
typedef struct kiln_file_info {
	const char *path; /* as given or as found beside it; NULL for a buffer */
	uint32_t format;  /* enum kiln_format */
	uint32_t version; /* KLNT: 2; GGUF: 2 or 3; safetensors: 0 (it has none) */
	uint64_t size;    /* bytes of the file (a buffer's; a KLNT block's, with ALLOW_TRAILING) */
	uint64_t first_tensor; /* model index of its first tensor */
	uint64_t tensor_count;
	/* The payload region: KLNT's payload_base (the header, directory and pad before it),
	 * safetensors' 8 + header length, GGUF's aligned start of the data section. What open
	 * reads of the file is [0, payload_base). */
	uint64_t payload_base;
	uint64_t payload_bytes; /* bytes from payload_base to the end of the file */
	/* What the format promises for payload offsets in the file: 64 for KLNT, GGUF's
	 * general.alignment (32 when absent), 1 for safetensors (it promises nothing). */
	uint32_t alignment;
	uint8_t flags; /* KLNT: the header's flags byte; 0 otherwise */
	uint8_t reserved8[3];
	uint32_t name_bytes;      /* KLNT: the header's name_bytes; 0 otherwise */
	uint32_t source;          /* enum kiln_source this file's bytes came from */
	uint64_t directory_bytes; /* KLNT: the header's directory_bytes; 0 otherwise */
	const void *base;     /* the file's first byte in memory (mapping, owned block, buffer) */
	uint32_t auto_choice; /* enum kiln_auto_choice for this file */
	uint32_t reserved32;  /* zero */
	/* The digest table the file carries itself (kiln/verify.h: a KLNT file's last tensor,
	 * left out of the model's tensors; a safetensors or GGUF key): its bytes in the file as
	 * stored (base64 text for safetensors), checked only when digests are asked for. 0 and 0
	 * when it has none. */
	uint64_t digests_offset;
	uint64_t digests_bytes;
} kiln_file_info;

#define KILN_FLAG_NAMES         0x01u
#define KILN_FLAG_LITTLE_ENDIAN 0x02u

/* Open flags (kiln_open_options.flags). */
enum kiln_open_flags {
	/* Also run payload verification (kiln_model_verify(): KLNT's gaps between payloads and
	 * 4-bit padding are zero). It reads those bytes only, not every payload byte. */
	KILN_OPEN_VERIFY_PAYLOAD = 1u << 0,
	/* Buffers of KLNT only: the block may be followed by other bytes. Without it a buffer,
	 * like a file, must be exactly one block (a longer one is FRAME). */
	KILN_OPEN_ALLOW_TRAILING = 1u << 1,
	/* mmap: fault the whole file in at open (MAP_POPULATE). */
	KILN_OPEN_POPULATE = 1u << 2,
	/* mmap: lock the mapping in memory (mlock). Fails with IO/ENOMEM or EPERM, with the
	 * RLIMIT_MEMLOCK limit in the message, when the limit is too small. */
	KILN_OPEN_LOCK = 1u << 3,
	/* mmap: ask for transparent huge pages for the mapping (MADV_HUGEPAGE); only file systems
	 * with large folios honour it for file mappings. Refusal is reported in advice_errno. */
	KILN_OPEN_HUGEPAGE = 1u << 4,
	/* read/uring: bypass the page cache with O_DIRECT, aligned as statx(STATX_DIOALIGN) says
	 * (else the device's logical block size). Falls back to buffered reads when the file system
	 * refuses, and says so in kiln_model_info.direct_fallback. */
	KILN_OPEN_DIRECT = 1u << 5,
	/* mmap: map the file copy-on-write (writable, MAP_PRIVATE | MAP_NORESERVE) instead of
	 * read-only shared, so a consumer that writes through a data pointer (a PyTorch tensor
	 * made with DLPack: torch has no read-only tensors) gets a private copy of the pages it
	 * writes instead of SIGSEGV; the file never sees the writes, and pages only read cost what
	 * the default mapping costs. READ/URING ignore it (their memory is private already).
	 * INVAL with KILN_OPEN_LOCK (it would copy every page) and for kiln_model_parse(). What
	 * the writes mean for copies, hints and memory: README.md, "Loading". */
	KILN_OPEN_PRIVATE = 1u << 6,
	/* Open the path given as the one file of the model, even when its name is a shard of a
	 * series (STEM-NNNNN-of-MMMMM.EXT) or it is a part of a split GGUF model: the shard's own
	 * tensors only, none found beside it. */
	KILN_OPEN_ONE_FILE = 1u << 7,
	/* Give every tensor whose data is misaligned for its dtype (alignment below
	 * kiln_dtype_align(); safetensors promises no alignment) an owned, 64-byte aligned copy,
	 * read at open, so typed loads through data pointers are safe everywhere. Other tensors
	 * stay zero-copy; kiln_model_info.realigned counts the copies. */
	KILN_OPEN_ALIGN = 1u << 8,
	/* Read the header and directory of each file and nothing of its payload: views have no
	 * data pointer (data is NULL) and their bytes are read when asked for, by
	 * kiln_tensor_copy(), kiln_tensor_read(), the slice reads and kiln_stream(), through the
	 * file's source (pread for a local file, ranged GETs for a URL). For inspecting a remote
	 * checkpoint or taking a few tensors of it. INVAL with POPULATE, LOCK, PRIVATE, ALIGN or a
	 * load buffer (they are about the payload's memory). */
	KILN_OPEN_DIRECTORY_ONLY = 1u << 9,
	/* Check every byte of every file against its content digests (kiln/verify.h: its sidecar
	 * FILE.kiln-digest that klnt digest writes, else a model_signing model.sig beside it, else
	 * its Hugging Face cache blob name) while the source brings it into memory: READ and URING
	 * hand each chunk to the hash as its last read lands, MMAP faults the mapping in (as
	 * POPULATE) a block at a time and hands each block over just faulted; the hash runs on a
	 * thread of its own while the source reads on (with kiln_open_options.threads > 1, on
	 * the reader that lands a chunk's last byte). One pass over the bytes; the open fails
	 * with KILN_CORRUPT naming the file, tensor, chunk, its byte range and both digests, and
	 * hands out nothing. NOTFOUND when a file has no digests (the message says how to make
	 * them), the digests' own errors (kiln_model_verify_digests) for damaged or foreign
	 * ones. INVAL for kiln_model_parse().
	 * With KILN_OPEN_DIRECTORY_ONLY the open reads each file's chunk digests (a sidecar, the
	 * file's own table) and every later read checks the parts it lands: kiln_tensor_read,
	 * copies, slices, ranges, kiln_stream, kiln_load, kiln_group_load, kiln_model_read_all,
	 * for a path or a URL. Each table chunk a read touches is hashed once, in file order, as
	 * its bytes land (the bytes of the chunk the read leaves out are read from the file: at
	 * most one chunk more at each end of a contiguous range); a read fails with KILN_CORRUPT as
	 * above, and kiln_load and kiln_group_load hand out no tensor then. kiln_stream's on_chunk
	 * sees bytes as they land, before their chunk is complete: its return says whether they
	 * passed. UNSUPPORTED when a file's only digests are SHA-256 of whole files (model_signing,
	 * the Hugging Face cache). kiln_model_info.digests_verified (open whole) and
	 * digest_chunks, digest_bytes say what was checked. */
	KILN_OPEN_VERIFY_DIGESTS = 1u << 10,
	/* Keep the views packed once the model is open (about 12 bytes a tensor instead of
	 * sizeof(kiln_tensor)), in address space that takes memory a page of views at a time, when
	 * one of them is first asked for; pointers handed out stay valid, from any thread. For a
	 * process that holds models open and uses few of their tensors. Each page of views costs a
	 * page fault and its unpacking on first use, so a runtime that touches every tensor pays
	 * more than it saves (docs/benchmarks.md, "Resident memory of an open"). Views under 16 KiB
	 * are left as they are. INVAL with a caller's allocator (it is given the whole index). */
	KILN_OPEN_PACK_VIEWS = 1u << 11
};

/* Access advice for a mapping (kiln_open_options.advice), applied after validation. */
enum kiln_advice {
	KILN_ADVICE_NORMAL = 0,
	KILN_ADVICE_SEQUENTIAL = 1,
	KILN_ADVICE_RANDOM = 2,
	KILN_ADVICE_WILLNEED = 3 /* start reading the whole file in the background */
};

/* Memory for the index and the header copies a model keeps; all three NULL (the default) means
 * malloc/free, with mappings of kiln's own for blocks of 32 MiB and more. The MMAP source keeps
 * a header of 2 MiB and more (a GGUF vocabulary) in a mapping of its own whatever the allocator,
 * reserved for the file's size so that it grows without moving. */
typedef struct kiln_allocator {
	void *(*alloc)(void *ctx, size_t size); /* must return 16-byte aligned memory or NULL */
	void (*free)(void *ctx, void *ptr, size_t size);
	void *ctx;
} kiln_allocator;

/*
 * Open options. A zeroed struct means every default; `size` may be 0 or sizeof(kiln_open_options)
 * and lets later versions grow the struct without breaking callers. Pass NULL for all defaults.
 */
struct kiln_open_options {
	uint32_t size;
	uint32_t flags;  /* enum kiln_open_flags */
	uint32_t source; /* enum kiln_source for paths: MMAP (default), READ, URING or AUTO */
	uint32_t advice; /* enum kiln_advice, for MMAP */
	const kiln_allocator *allocator;
	uint32_t chunk_size;  /* READ/URING: bytes per read request; 0 means 4 MiB, at most 1 GiB */
	uint32_t queue_depth; /* URING: requests in flight; 0 means 32 */
	/* READ/URING, a model of one file: load it into this caller memory instead of fresh owned
	 * memory, so a runtime can reuse one buffer (fresh memory costs a page fault and a zeroing
	 * per page). 64-byte aligned (page aligned lets O_DIRECT read in place), at least the
	 * file's size; borrowed: kiln never frees it, and it must outlive the model. NULL: owned
	 * memory. */
	void *buffer;
	size_t buffer_size;
	/* READ/URING: threads reading parts of each file's payload at once, the calling thread
	 * included (each with its own engine: pread, or an io_uring of its own). 0 or 1: the
	 * calling thread alone; kiln starts no thread unless asked. At most 64. Worth it where
	 * copying is the bound (a warm file into fresh memory: page faults and the copy run on
	 * every core). */
	uint32_t threads;
	/* enum kiln_format: AUTO (0) tells each file's format from its first bytes, else from a
	 * name ending in .safetensors, .gguf or .klnt (and a path ending in .json is a
	 * safetensors index); another value refuses files of other formats (FRAME naming what
	 * the file is). */
	uint32_t format;
	/* URLs: how to reach them and how to fetch (kiln_remote_options); NULL: the defaults and
	 * the environment. Ignored for local paths. */
	const struct kiln_remote_options *remote;
	uint64_t reserved[2]; /* zero */
};

/*
 * kiln_model_open() (kiln/kiln.h) in full. It validates the structure of every file in one pass
 * each:
 * - a KLNT file; a shard of a KLNT series STEM-NNNNN-of-MMMMM.klnt opens the whole series, its
 *   siblings found by name beside it;
 * - a .safetensors file; a shard model-NNNNN-of-MMMMM.safetensors opens every shard; a
 *   model.safetensors.index.json (any name ending in .json) opens the shards its weight_map
 *   names, and checks that each tensor is in the shard the index says;
 * - a GGUF file; a part NAME-NNNNN-of-MMMMM.gguf of a split model opens every part, checked
 *   against the parts' split.no / split.count / split.tensors.count keys.
 * KILN_OPEN_ONE_FILE opens the path alone. Every file must be of one format; names must be
 * unique across the files (TYPE naming both files otherwise).
 *
 * With the default MMAP source each file is mapped read-only (copy-on-write with
 * KILN_OPEN_PRIVATE) and only its header and directory, [0, payload_base), are read; payload
 * pages are not touched unless KILN_OPEN_VERIFY_PAYLOAD, POPULATE, LOCK, ALIGN or WILLNEED ask
 * for it. With READ or URING the header and directory are read and validated first, then the
 * whole file is read into owned, page-aligned memory (so a rejected file costs no payload I/O).
 * Data pointers are aligned in memory as their file offsets are, whatever the source.
 *
 * Returns 0 and sets *out, or a kiln_code with *out set to NULL: FRAME/TYPE/LIMIT/UTF8 for a
 * file whose bytes are rejected (an empty or short file is LIMIT; err->file says which file),
 * IO when a file cannot be opened, stat'ed or mapped, or is not a regular file (sys_errno says
 * why: ENOENT, EACCES, EISDIR, ...; a missing shard is "shard 2 of 3 is missing"), NOMEM, INVAL
 * for a NULL argument, a nonzero reserved option, or a series that is ambiguous (another series
 * of the same stem and a different shard count beside it).
 *
 * The header and directory are read with pread into memory of the model's own and validated
 * there, never through the mapping, so a file that shrinks or changes during open gives IO or a
 * format error, never SIGBUS. Payload verification reads through pread too.
 *
 * The model keeps the mappings; views and data pointers live until kiln_model_close(). If a file
 * is truncated by someone else while mapped, touching the lost payload pages through a data
 * pointer raises SIGBUS, as with any mapping (kiln_tensor_copy() and kiln_stream() read with
 * pread and report IO instead); kiln writes files by rename so its own writer never does that.
 */
/*
 * Open `count` paths as one model. One path is kiln_model_open(). A list is either the whole of
 * one series (any order; INVAL for a list that names two series, repeats a shard or leaves one
 * out) or files that are no series at all, kept in the given order (INVAL for a list mixing the
 * two). Same errors as kiln_model_open().
 */
KILN_API int kiln_model_open_files(const char *const *paths, uint32_t count,
				   const kiln_open_options *opts, kiln_model **out,
				   kiln_error *err);

/*
 * Validate the `len` bytes at `buf` (one file of any format: KLNT, safetensors, GGUF) and index
 * them without copying. The buffer is borrowed: it must stay valid and unchanged until
 * kiln_model_close(). Data pointers are aligned in memory as buf is plus their file offset.
 * Same errors as kiln_model_open(), without IO.
 */
KILN_API int kiln_model_parse(const void *buf, size_t len, const kiln_open_options *opts,
			      kiln_model **out, kiln_error *err);

/* Close unless ranges are still pinned: then return BUSY, with the count in the message, and
 * leave the model open. Returns 0 after closing. */
KILN_API int kiln_model_try_close(kiln_model *model, kiln_error *err);

/*
 * Payload verification (KLNT spec section 9): in every KLNT file, every byte between payloads is
 * zero and the unused high nibble of an odd-count 4-bit tensor is zero. Reads only those bytes
 * (the gaps, under 64 bytes each, and the last byte of each odd-count 4-bit tensor), not every
 * payload byte: no format has a checksum, so the other payload bytes have nothing to be checked
 * against; to read them all (to find unreadable sectors) use kiln_model_read_all(). safetensors
 * and GGUF files have nothing more to verify (safetensors' tensors cover every data byte; GGUF
 * sets no rule for its padding). Returns 0 or TYPE (with the file, tensor and offset of the first
 * bad byte). Idempotent.
 */
KILN_API int kiln_model_verify(const kiln_model *model, kiln_error *err);

/* Fill *info (zeroes for a NULL model; a NULL info is ignored). */
KILN_API void kiln_model_get_info(const kiln_model *model, kiln_model_info *info);

/* Fill *info for file `file` of the model. Returns 0, or INVAL (zeroing *info) when out of
 * range. */
KILN_API int kiln_model_file_info(const kiln_model *model, uint32_t file, kiln_file_info *info);

/* Number of files (shards); 0 for NULL. */
KILN_API uint32_t kiln_model_files(const kiln_model *model);
/* Whether `path` is one of the model's files (the same file system object, whatever its name):
 * what a writer must not replace while it reads the model. 0 for a buffer's model, a NULL or
 * missing path. */
KILN_API int kiln_model_has_file(const kiln_model *model, const char *path);

/*
 * Validate without keeping anything: kiln_model_parse() then close, with `flags` as in
 * kiln_open_options. Returns 0 or the class; *err has the detail.
 */
KILN_API int kiln_validate(const void *buf, size_t len, uint32_t flags, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KILN_MODEL_H */
