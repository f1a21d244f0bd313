/* SPDX-License-Identifier: MIT */
/*
 * kiln/load.h: getting tensors' bytes where they are needed (included by kiln/kiln.h): page-cache
 * hints; streams of chunks into caller memory or pinned staging; the load pipeline onto host
 * memory or devices (docs/pipeline.md); read-once loading across a group of ranks; slices for
 * tensor parallelism; pinning for DMA.
 */
#ifndef KILN_LOAD_H
#define KILN_LOAD_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kiln_hint {
	KILN_HINT_WILLNEED = 0, /* start reading the pages in the background (prefetch a layer) */
	KILN_HINT_DONTNEED = 1, /* drop this mapping's pages; they are re-read on the next touch */
	KILN_HINT_COLD = 2,     /* MADV_COLD: reclaim these pages first under memory pressure */
	KILN_HINT_PAGEOUT = 3   /* MADV_PAGEOUT: reclaim them now */
};

/*
 * Apply a hint to the pages of `count` tensors (indices in `tensors`), rounded out to whole
 * pages: WILLNEED rounds outwards so every byte is covered; the releasing hints round inwards so
 * a neighbour's pages sharing a page are not dropped. Only for the MMAP source (owned and
 * borrowed memory is the caller's business): UNSUPPORTED otherwise. Returns 0, INVAL for a bad
 * index or hint, UNSUPPORTED when the kernel lacks the hint (EINVAL from madvise), IO otherwise.
 * WILLNEED waits while the kernel submits the reads (in 2 MiB pieces); it is for tensors used
 * out of file order: a walk in file order is served better by the kernel's own read-around with
 * the default advice (docs/benchmarks.md).
 */
KILN_API int kiln_tensor_hint(const kiln_model *model, const uint64_t *tensors, size_t count,
			      unsigned hint, kiln_error *err);

/* One landed chunk of a streaming read. */
typedef struct kiln_chunk {
	uint64_t tensor;  /* the tensor's model index (KILN_NO_INDEX for kiln_model_read_all) */
	uint32_t buffer;  /* staging buffer index (staging mode), else 0 */
	uint32_t file;    /* the model's file the bytes came from */
	uint64_t offset;  /* offset of the chunk within the tensor's payload */
	uint64_t length;  /* bytes */
	const void *data; /* where the bytes landed */
} kiln_chunk;

/* Called once per landed chunk, on the thread that called the streaming function, before it
 * returns. With io_uring chunks land in completion order: no order is promised, across tensors
 * or within one. With pread they come in request order (the chunks of one window may all be in
 * place before the first of them is told of: destinations must not overlap). Return 0 to go on,
 * nonzero to stop: the stream waits for the reads in flight and returns CANCELED. */
typedef int (*kiln_chunk_fn)(void *ctx, const kiln_chunk *chunk);

/* Staging mode: called before staging buffer `buffer` is filled again, so an asynchronous copy
 * started from it (e.g. to a device) can be waited for. Return nonzero to stop (CANCELED). */
typedef int (*kiln_reuse_fn)(void *ctx, uint32_t buffer);

enum kiln_stream_engine {
	/* pread when the page cache holds every page asked for (cachestat(2), Linux 6.5+; a copy
	 * gains nothing from requests in flight), else io_uring, falling back to pread when
	 * unavailable. kiln_stream_result.engine says which ran. */
	KILN_ENGINE_AUTO = 0,
	KILN_ENGINE_URING = 1, /* io_uring; still falls back, and says so in the result */
	/* plain pread, one request at a time (neighbouring chunks of one chunk-sized window, at
	 * most 4 KiB apart, in one preadv when they land in the caller's memory unchecked) */
	KILN_ENGINE_PREAD = 2
};

enum kiln_stream_flags {
	/* Read with O_DIRECT: aligned reads into internal bounce buffers (or straight into the
	 * caller's memory when offset, length and address are aligned). Falls back to buffered
	 * reads when refused, and says so in the result. */
	KILN_STREAM_DIRECT = 1u << 0
};

typedef struct kiln_stream_options {
	uint32_t size;          /* 0 or sizeof(kiln_stream_options) */
	uint32_t flags;         /* enum kiln_stream_flags */
	uint32_t engine;        /* enum kiln_stream_engine */
	uint32_t chunk_size;    /* bytes per request; 0 means 4 MiB (staging: the buffer size) */
	uint32_t queue_depth;   /* requests in flight; 0 means 32 (staging: at most the buffers) */
	uint32_t staging_count; /* staging mode: number of buffers in `staging` */
	void *const *staging;   /* staging mode: caller's buffers (e.g. pinned host memory) */
	size_t staging_size;    /* staging mode: bytes in each buffer */
	kiln_chunk_fn on_chunk; /* optional in direct mode, required in staging mode */
	kiln_reuse_fn before_reuse; /* staging mode, optional */
	void *ctx;                  /* passed to both callbacks */
	uint64_t reserved[4];
} kiln_stream_options;

typedef struct kiln_stream_result {
	uint64_t bytes;          /* payload bytes landed */
	uint64_t chunks;         /* chunks landed (callback calls) */
	uint64_t retries;        /* requests re-issued after EINTR, EAGAIN or a short read */
	uint32_t engine;         /* enum kiln_stream_engine actually used (URING or PREAD) */
	uint32_t direct;         /* 1 when O_DIRECT was used */
	int32_t uring_fallback;  /* errno that made io_uring unavailable, else 0 */
	int32_t direct_fallback; /* errno that made O_DIRECT unavailable, else 0 */
} kiln_stream_result;

/*
 * Read the payloads of `count` tensors (model indices in `tensors`, from any files; NULL means
 * all, in order) into caller memory, in chunks with up to queue_depth reads in flight: one queue
 * of reads across the model's files.
 *
 * Direct mode (`dests` not NULL): dests[i] receives the whole payload of tensors[i] (it must hold
 * byte_length bytes; any alignment). on_chunk, when set, is called as each chunk lands so a copy
 * to a device can start while later chunks are read.
 * Staging mode (`dests` NULL, opts->staging set): chunks of at most staging_size bytes land in
 * the caller's staging buffers in rotation; on_chunk must consume each one (or start an
 * asynchronous copy that before_reuse waits for). Needs staging_count >= 1.
 *
 * A model opened KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS checks every chunk against
 * its digests (KILN_CORRUPT); the hash may run on another thread after on_chunk returns, so
 * on_chunk and the caller leave the bytes as they landed (destinations until the call
 * returns, a staging buffer until before_reuse): copy them to change them. A checked staged
 * stream keeps one of its staging buffers out of flight while the one before is hashed.
 *
 * Works for every source. MMAP reads the file (the mapping's pages may not be in memory); READ,
 * URING and BUFFER hold each whole file already and copy it from memory (reported as PREAD;
 * KILN_STREAM_DIRECT has nothing to do there). EINTR, EAGAIN and short reads are retried; a file
 * that ends early is IO (EIO). On any failure every read in flight is waited for before returning,
 * so no buffer is written after the call returns. Returns 0, INVAL, CANCELED, NOMEM, IO or
 * CORRUPT; *result (optional) is filled either way.
 */
KILN_API int kiln_stream(const kiln_model *model, const uint64_t *tensors, size_t count,
			 void *const *dests, const kiln_stream_options *opts,
			 kiln_stream_result *result, kiln_error *err);

/*
 * Read tensor `index` into dst[0, cap) with the stream engine's defaults: io_uring (falling back
 * to pread where it is unavailable), 4 MiB chunks, up to 32 in flight. on_chunk (optional) is
 * called with ctx as each chunk lands in dst, so a copy to a device can start while later chunks
 * are read. The one-call form of kiln_stream() for one tensor; unlike kiln_tensor_copy() (one
 * pread), it keeps several reads in flight. Works for every source (READ, URING and BUFFER copy
 * from memory); any alignment of dst. Returns 0, INVAL when the index is bad or cap < byte_length
 * (or dst is NULL for a non-empty tensor), CANCELED when on_chunk returned nonzero, NOMEM, IO (a
 * file that ends early is EIO). On failure no read is left in flight: dst is not written after the
 * call.
 */
KILN_API int kiln_tensor_read(const kiln_model *model, uint64_t index, void *dst, size_t cap,
			      kiln_chunk_fn on_chunk, void *ctx, kiln_error *err);

/*
 * Read every byte of every file of the model, headers, directories and the gaps between payloads
 * included, file after file, and keep none of it: for finding unreadable sectors (an EIO is
 * returned as IO, the message naming the offset of the failed read) and, without O_DIRECT, for
 * warming the page cache. The same engine, options and fall-backs as kiln_stream() in staging
 * mode: the chunks land in opts->staging when given (on_chunk and before_reuse as there), else
 * in kiln's own buffers, queue_depth of them (0 means 4) of chunk_size bytes (0 means 4 MiB);
 * opts NULL means every default. on_chunk is optional; each chunk reports tensor KILN_NO_INDEX,
 * its file and its offset in that file, and its data lives only until the callback returns. With
 * KILN_STREAM_DIRECT the device is read rather than the page cache, where the file system allows
 * O_DIRECT (result->direct says whether it did). For the BUFFER source the bytes are copied from
 * memory. result->bytes is the files' sizes added up on success. Returns 0, INVAL, CANCELED, NOMEM
 * or IO.
 */
KILN_API int kiln_model_read_all(const kiln_model *model, const kiln_stream_options *opts,
				 kiln_stream_result *result, kiln_error *err);

/*
 * The load pipeline: tensors into device memory (or host memory) at the speed of the storage,
 * with several reader threads, a bounded amount in flight, and each tensor announced once its
 * bytes are in place, in the order asked for.
 *
 * A device is a table of operations (kiln_device). NULL means host memory: the reads land in
 * the destinations directly. A device with `copy` set is staged: reads land in pinned host
 * buffers (host_alloc; at most kiln_load_options.pinned_bytes in all), which copy() moves to the
 * device asynchronously on a lane (one per staging buffer, e.g. a CUDA stream); wait() is called
 * before a buffer is refilled and before a tensor is announced. The CUDA adapter gives one for
 * every visible GPU (kiln_cuda_device); tests use a staged device over host memory.
 */
typedef struct kiln_device {
	uint32_t size;    /* 0 or sizeof(kiln_device) */
	uint32_t count;   /* devices, numbered 0..count-1; 0 means 1 */
	const char *name; /* for messages: "host", "cuda", ... */
	void *ctx;        /* passed to every operation */
	/* Device memory for the arena kiln allocates when the caller gives no destinations; NULL:
	 * aligned host memory. */
	int (*alloc)(void *ctx, uint32_t device, size_t len, void **ptr, kiln_error *err);
	void (*release)(void *ctx, uint32_t device, void *ptr);
	/* Staged devices: pinned host memory (NULL: aligned host memory), and the asynchronous copy
	 * of len bytes from src (pinned) to dst on `device`, on `lane`, and the wait for every copy
	 * queued on a lane to that device to complete. NULL copy: not staged. */
	int (*host_alloc)(void *ctx, size_t len, void **ptr, kiln_error *err);
	void (*host_release)(void *ctx, void *ptr);
	int (*copy)(void *ctx, uint32_t device, uint32_t lane, void *dst, const void *src,
		    size_t len, kiln_error *err);
	int (*wait)(void *ctx, uint32_t device, uint32_t lane, kiln_error *err);
	/* Optional, for KILN_LOAD_REGISTER: make the whole pages [ptr, ptr + len) of host memory
	 * (file pages: register them read only) a source copy() can read without staging, for
	 * every device, and undo it (given the same ptr) once the copies from it are waited for.
	 * copy() must also accept up to a page at each end of a window that is not registered
	 * (CUDA copies such bytes through its own staging). */
	int (*host_register)(void *ctx, const void *ptr, size_t len, kiln_error *err);
	void (*host_unregister)(void *ctx, const void *ptr);
	uint64_t reserved[2]; /* zero */
} kiln_device;

/* A tensor whose bytes are all on its device (kiln_load_options.on_ready). */
typedef struct kiln_ready {
	uint64_t
	    position;    /* its position in the list loaded (0, 1, ... in the order of the list) */
	uint64_t tensor; /* its model index */
	uint32_t device;
	uint32_t reserved;
	void *data; /* where it is, on the device */
} kiln_ready;

typedef struct kiln_load_progress {
	uint64_t bytes, bytes_total; /* payload bytes in place, of all */
	/* tensors announced, of all: counted in list order, so without on_ready, whose threads
	 * read a run of the list each, the count trails the bytes until the first run is done */
	uint64_t tensors, tensors_total;
	double seconds; /* since the load began */
} kiln_load_progress;

enum kiln_load_flags {
	/* Read with O_DIRECT (the page cache neither used nor filled), falling back to buffered
	 * reads where refused (kiln_load_result.direct says which). */
	KILN_LOAD_DIRECT = 1u << 0,
	/* Buffered reads: drop each range from the page cache once it is in place
	 * (POSIX_FADV_DONTNEED), so a load larger than memory does not push out everything else. */
	KILN_LOAD_DROP_CACHE = 1u << 1,
	/* Staged devices with host_register: no staging. Each thread registers the file's own
	 * bytes in memory (the mapping, or a file read whole at open) a window at a time, at most
	 * pinned_bytes / threads each, copies to the device straight from it, waits, and
	 * unregisters. kiln_load_result.pinned_bytes is then the most bytes registered at once.
	 * INVAL with KILN_LOAD_DIRECT, on a device without host_register, or for a tensor whose
	 * file is not in memory (a model opened directory-only, a URL). Two such loads of one
	 * model at once can register the same pages, which CUDA refuses (IO). */
	KILN_LOAD_REGISTER = 1u << 2
};

typedef struct kiln_load_options {
	uint32_t size;    /* 0 or sizeof(kiln_load_options) */
	uint32_t flags;   /* enum kiln_load_flags */
	uint32_t threads; /* reader threads; 0: the online CPUs, at most 16 */
	/* enum kiln_stream_engine of each thread's reads. AUTO: pread for reads through the page
	 * cache (the threads give the depth; read-ahead gives the disk long requests), io_uring's
	 * AUTO for KILN_LOAD_DIRECT. */
	uint32_t engine;
	/* Bytes per read request; 0: 16 MiB (staged: the staging buffer size, 0 meaning 8 MiB;
	 * checked reads of local files, 256 KiB). */
	uint32_t chunk_size;
	uint32_t reserved32;
	/* Bytes being read at once, all threads together: each thread takes a piece of at most
	 * inflight_bytes / threads of the list at a time. 0: pieces of 128 MiB. Pieces are taken
	 * in list order when on_ready is set; without it each thread reads a contiguous run of
	 * the list (about 1 / threads of its bytes, front to back) before helping the others
	 * from their ends, one long run for read-ahead (docs/pipeline.md, "Lanes"). */
	uint64_t inflight_bytes;
	/* Staged devices: pinned staging, all threads together (at least two chunks a thread); with
	 * KILN_LOAD_REGISTER, bytes registered at once (at least a page a thread). 0: 256 MiB. */
	uint64_t pinned_bytes;
	const kiln_device *device; /* NULL: host memory */
	/* The device of each tensor (below device->count); NULL: device 0. Called once per tensor
	 * before any read, on the calling thread. */
	uint32_t (*place)(void *ctx, const kiln_tensor *t);
	/* Destinations: dests[k] on the device placed for tensors[k], byte_length bytes each. NULL:
	 * kiln allocates one arena per device used (kiln_load's *arena), every tensor 64-byte
	 * aligned in it. */
	void *const *dests;
	/* Called on the calling thread for each tensor once its bytes are in place, in the order
	 * of the list (tensor k only after 0..k-1), so a runtime can start on the first layers
	 * while later ones load. Nonzero stops the load (CANCELED). Setting it makes the
	 * threads read in list order (inflight_bytes): leave it NULL when only the end counts. */
	int (*on_ready)(void *ctx, const kiln_ready *r);
	/* Called on the calling thread every 50 ms or so and at the end. Nonzero: CANCELED. */
	int (*progress)(void *ctx, const kiln_load_progress *p);
	void *ctx;
	uint64_t reserved[4]; /* zero */
} kiln_load_options;

typedef struct kiln_load_result {
	uint64_t bytes;   /* payload bytes put in place */
	uint64_t tensors; /* tensors announced */
	double seconds;
	uint32_t threads;       /* reader threads that ran */
	uint32_t engine;        /* enum kiln_stream_engine of the reads (the last piece's) */
	uint32_t direct;        /* 1 when O_DIRECT was used */
	uint32_t devices;       /* devices that received tensors */
	uint64_t peak_inflight; /* most bytes being read at once (counted) */
	uint64_t pinned_bytes;  /* staging allocated (0 unless staged); KILN_LOAD_REGISTER: the most
				   bytes registered at once */
	uint64_t arena_bytes;   /* device memory kiln allocated, all devices */
	uint64_t extra_device_bytes; /* of it, beyond the tensors' bytes (alignment) */
	uint64_t reserved[4];
} kiln_load_result;

/* Device memory kiln_load allocated: one block per device used. */
typedef struct kiln_arena kiln_arena;

/*
 * Load the payloads of `count` tensors (model indices in `tensors`, in the order they are to be
 * announced; NULL means all, in file order) onto the device of opts. ptrs (count entries, may be
 * NULL) receives where each tensor landed; with no destinations in opts, *arena receives kiln's
 * allocation (free it with kiln_arena_free once done with the tensors). Works for every format
 * and source: a local file is read with pread or io_uring on each thread (O_DIRECT with
 * KILN_LOAD_DIRECT), a loaded file is copied from memory, a URL opened directory-only is fetched
 * with ranged GETs. On any failure or cancel every thread and copy is waited for, staging and
 * the arena are freed, and nothing is written afterwards. Returns 0; INVAL (options, an index,
 * a NULL destination, a device number out of range); CANCELED; NOMEM; IO (a read or a device
 * operation, its message naming it). *result (optional) is filled either way.
 */
KILN_API int kiln_load(const kiln_model *model, const uint64_t *tensors, size_t count,
		       const kiln_load_options *opts, void **ptrs, kiln_arena **arena,
		       kiln_load_result *result, kiln_error *err);

/* Free an arena of kiln_load (each device's block). NULL is accepted. */
KILN_API void kiln_arena_free(kiln_arena *arena);

/*
 * Read once per group: ranks that each opened the same model (their own copy, or one shared
 * file system) load it with each byte read by one rank only, exchanging the rest through the
 * caller's collective (MPI, NCCL, torch.distributed, or threads). The payload bytes of the list,
 * laid end to end, are cut into chunks of chunk_size; chunk c is read by rank c % world, and
 * each round of world chunks is all-gathered, so every rank ends with every byte.
 */
typedef struct kiln_collective {
	uint32_t size;        /* 0 or sizeof(kiln_collective) */
	uint32_t rank, world; /* this rank, of world */
	void *ctx;
	/* Every rank calls it with the same len, in the same order; afterwards
	 * all[r * len, (r + 1) * len) holds the `mine` of rank r (all holds world * len bytes).
	 * Nonzero: the exchange failed (set err to say how; else it is IO). It must not wait
	 * forever for a rank that died: a timeout is the collective's to set. */
	int (*all_gather)(void *ctx, const void *mine, void *all, size_t len, kiln_error *err);
	uint64_t reserved[4]; /* zero */
} kiln_collective;

/* kiln_group_options.flags, besides KILN_LOAD_DIRECT: every rank compares every byte it
 * receives with its own file (it reads the whole payload; the group then proves the ranks hold
 * the same bytes, not only the same headers). Without it, 4 KiB of each chunk. */
#define KILN_GROUP_VERIFY_ALL (1u << 8)

typedef struct kiln_group_options {
	uint32_t size;       /* 0 or sizeof(kiln_group_options) */
	uint32_t chunk_size; /* bytes a rank reads per round; 0: 8 MiB */
	uint32_t flags;      /* KILN_LOAD_DIRECT, KILN_GROUP_VERIFY_ALL */
	uint32_t reserved32;
	uint64_t reserved[4]; /* zero */
} kiln_group_options;

typedef struct kiln_group_result {
	uint64_t bytes_read;     /* payload bytes this rank read from its source */
	uint64_t bytes_received; /* payload bytes the other ranks read for it */
	uint64_t rounds;         /* exchanges of chunks */
	uint64_t staging_bytes;  /* memory held for the exchange: (world + 2) slots of a chunk */
	uint64_t bytes_verified; /* received bytes compared with this rank's own file */
	uint64_t reserved[3];
} kiln_group_result;

/*
 * Load the payloads of `count` tensors (model indices; NULL: all) into dests[k] on every rank
 * of the collective. Before any chunk moves, the ranks exchange fingerprints of what they
 * opened (the number of files, their sizes, the bytes of their headers and directories, URLs'
 * ETags, the list, the chunk size, the world) and all fail with INVAL naming the first field
 * that differs. Then the payloads: each chunk carries a digest its receivers check (IO, EBADMSG:
 * damaged by the collective), and each receiver compares 4 KiB of it, at an offset its digest
 * picks, with its own file (all of it with KILN_GROUP_VERIFY_ALL; not for URLs, whose ETags were
 * compared): INVAL naming the first tensor and byte that differ, on every rank. Two different
 * checkpoints with the same headers are found in the first round; a file crafted to differ in
 * a few bytes only by KILN_GROUP_VERIFY_ALL. A rank whose read fails tells the others in the
 * next exchange: every rank returns an error naming it. Each round's read runs on a thread of
 * its own while the round before is exchanged. Memory: (world + 2) chunks, each with a 256-byte
 * head. Returns 0, INVAL, NOMEM, IO, or the collective's error.
 */
KILN_API int kiln_group_load(const kiln_model *model, const uint64_t *tensors, size_t count,
			     void *const *dests, const kiln_collective *collective,
			     const kiln_group_options *opts, kiln_group_result *result,
			     kiln_error *err);

/*
 * Slices: part of a tensor, for tensor parallelism. A slice keeps indices [start, stop) of one
 * axis and every index of the others; its bytes are those elements, row-major, packed like the
 * tensor (the tensor's shape with that axis cut to stop - start). Axis 0 (or any axis after
 * axes of size 1) is one contiguous run of the payload; an inner axis is one run per index of
 * the axes before it.
 *
 * Where a slice may be cut: anywhere for whole-byte dtypes; on whole bytes for 4-bit dtypes (an
 * axis whose inner elements are odd in number cuts only at even indices, or at its end for the
 * first axis); on whole blocks for opaque layouts, taken as rows (every axis but the last) of
 * blocks that each hold the same number of elements of the last axis. Anything else is INVAL
 * with a message giving the nearest valid bounds. The whole axis is always a valid slice.
 */
typedef struct kiln_slice {
	uint32_t axis;
	uint32_t reserved; /* zero */
	uint64_t start, stop;
} kiln_slice;

/* Check slice `s` of tensor `t` and set *bytes to the bytes it takes. Returns 0 or INVAL (axis,
 * range, or bounds that cut a byte or a block: the message gives the nearest valid ones). */
KILN_API int kiln_slice_size(const kiln_tensor *t, const kiln_slice *s, uint64_t *bytes,
			     kiln_error *err);

/* Rank `rank` of `world`'s even share of axis `axis` of `t`: whole granules (bytes or blocks)
 * split as evenly as they go, ranks in order, so the shares tile the axis. Returns 0 and *out,
 * or INVAL (rank >= world, no such axis, an axis that cannot be cut). */
KILN_API int kiln_slice_share(const kiln_tensor *t, uint32_t axis, uint32_t rank, uint32_t world,
			      kiln_slice *out, kiln_error *err);

/*
 * Read slice `s` of tensor `index` into dst[0, cap) (cap >= kiln_slice_size()). Reads only the
 * slice's bytes: one read per run, split in chunks, all in flight together through io_uring
 * (pread where unavailable; memcpy for a borrowed buffer). on_chunk (optional) sees each chunk
 * as it lands, with chunk->offset its offset in dst. Returns 0, INVAL (bad slice, index, cap),
 * CANCELED, NOMEM, IO (a file that ends early is EIO, never SIGBUS).
 */
KILN_API int kiln_tensor_read_slice(const kiln_model *model, uint64_t index, const kiln_slice *s,
				    void *dst, size_t cap, kiln_chunk_fn on_chunk, void *ctx,
				    kiln_error *err);

/* Read bytes [offset, offset + length) of tensor `index`'s payload into dst[0, cap), like
 * kiln_tensor_read_slice(). INVAL when the range passes the payload's end or cap < length. */
KILN_API int kiln_tensor_read_range(const kiln_model *model, uint64_t index, uint64_t offset,
				    uint64_t length, void *dst, size_t cap, kiln_chunk_fn on_chunk,
				    void *ctx, kiln_error *err);

/*
 * Many slices in one call, with one queue of reads: slices[k] of tensor tensors[k] lands in
 * dests[k] (kiln_slice_size() bytes, any alignment), the runs of one tensor in flight with the
 * next one's, so a tensor-parallel rank's share of a whole model streams like one read. Every
 * slice is checked before the first read. opts as kiln_stream() in direct mode (chunk size,
 * queue depth, engine, KILN_STREAM_DIRECT, on_chunk with chunk->tensor the tensor's index and
 * chunk->offset within its slice bytes); staging buffers do not apply. A queue depth of 0 means
 * 32, or 256 when the runs average under 512 KiB (many small reads want many in flight).
 * Returns 0, INVAL (an index, a slice, a NULL destination for a non-empty slice), CANCELED,
 * NOMEM, IO; *result (optional) sums the batches.
 */
KILN_API int kiln_read_slices(const kiln_model *model, const uint64_t *tensors,
			      const kiln_slice *slices, size_t count, void *const *dests,
			      const kiln_stream_options *opts, kiln_stream_result *result,
			      kiln_error *err);

/* Zero copy: when slice `s` is one contiguous run (axis 0, or only size-1 axes before it), set
 * *data to its first byte in the model's memory (the mapping, the owned file or the
 * buffer; valid until close) and *bytes to its length. UNSUPPORTED when the slice needs more
 * than one run (read it with kiln_tensor_read_slice()); INVAL for a bad slice. */
KILN_API int kiln_tensor_slice_data(const kiln_model *model, uint64_t index, const kiln_slice *s,
				    const void **data, uint64_t *bytes, kiln_error *err);

/*
 * Called by kiln_tensor_pin(), on its thread, with each newly pinned range after mlock: the place
 * for cudaHostRegister(ptr, len, read-only). Return 0 when the range is registered, nonzero to
 * fail the pin. A failing hook says why in `why`, which kiln passes zeroed and never NULL: a
 * one-line reason in why->message (NUL-terminated; e.g. the CUDA error string) and, when an errno
 * is the cause, why->sys_errno. kiln reads only those two fields. kiln_tensor_pin() then munlocks
 * the range and fails with IO, sys_errno as the hook set it (0 otherwise), and the message
 * "the pin hook failed for tensor N: <reason>" (cut to fit; "it returned R" with no reason).
 */
typedef int (*kiln_pin_fn)(void *ctx, void *ptr, size_t len, kiln_error *why);
/* Called with the same range when it is unpinned. */
typedef void (*kiln_unpin_fn)(void *ctx, void *ptr, size_t len);

typedef struct kiln_pin_hooks {
	kiln_pin_fn pin;
	kiln_unpin_fn unpin;
	void *ctx;
} kiln_pin_hooks;

/*
 * Pin the page-aligned range covering tensor `index` in memory (mlock), then call hooks->pin
 * (optional) with it. Pins nest: each pin needs one kiln_tensor_unpin(). Works for the MMAP
 * source (file pages, read only) and owned READ/URING memory; UNSUPPORTED for BUFFER. When
 * mlock fails (RLIMIT_MEMLOCK too small: ENOMEM or EPERM) the error is IO with the errno and a
 * message giving the limit and the bytes asked for. When hooks->pin fails, IO with the hook's
 * reason (see kiln_pin_fn) and nothing stays pinned. Returns 0, INVAL, UNSUPPORTED, NOMEM, IO.
 */
KILN_API int kiln_tensor_pin(kiln_model *model, uint64_t index, const kiln_pin_hooks *hooks,
			     kiln_error *err);

/* Undo one kiln_tensor_pin() of `index`: call the unpin hook given at pin time, then munlock.
 * Returns 0, or INVAL when the tensor is not pinned. */
KILN_API int kiln_tensor_unpin(kiln_model *model, uint64_t index, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KILN_LOAD_H */
