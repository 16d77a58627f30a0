/*
 * bounce.h — the C ABI of bounce (libbounce.so, built by `make capi`).
 *
 * ABI version BOUNCE_ABI_VERSION. The promise: within one ABI version no
 * function, type or constant below changes meaning or layout; new ones may be
 * added. A program checks bounce_abi_version() at start and refuses a library
 * whose version differs from the one it was built against.
 *
 * Version 2 (from 1): pulls (bounce_pull, bounce_pull_blocks), pools with a
 * KV layout (bounce_layout, bounce_register_pool_layout), the code
 * BOUNCE_ERR_INCOMPATIBLE_LAYOUT; and two changes a version-1 program must
 * be rebuilt for: bounce_event gained the fields pull and quiescent (its
 * layout grew), and bounce_submit_blocks counts each side's ids (n_src,
 * n_dst: a block-size conversion pairs groups of ids). Every other
 * declaration is unchanged.
 *
 * Conventions
 *  - Every function is thread-safe. Objects are named by opaque handles
 *    (uint64_t, never 0 when valid); no Go pointer ever crosses the boundary.
 *  - Functions return a bounce_code (BOUNCE_OK or an error). When err is not
 *    NULL and the call fails, *err is set to a NUL-terminated message that
 *    the library allocated; release it with bounce_free. On success *err is
 *    left untouched.
 *  - Memory the library returns (strings, descriptor blobs, event fields) is
 *    the caller's to release with bounce_free (bounce_event_free for an
 *    event). Memory the caller passes in (configuration text, descriptor
 *    arrays, id arrays, tags) is read during the call only and never kept.
 *  - Registered memory (bounce_register_memory, bounce_register_pool) is the
 *    caller's: it must stay valid until it was deregistered or the agent was
 *    closed, and a batch's sources and destinations until bounce_batch_release
 *    succeeded (BOUNCE_ERR_NOT_QUIESCENT says a transport may still touch
 *    them: keep the memory).
 */
#ifndef BOUNCE_H
#define BOUNCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BOUNCE_ABI_VERSION 2

/* Result codes. */
typedef int32_t bounce_code;
#define BOUNCE_OK 0
#define BOUNCE_ERR_INVALID 1        /* bad argument or configuration */
#define BOUNCE_ERR_BAD_HANDLE 2     /* no such agent or batch (closed, released) */
#define BOUNCE_ERR_UNKNOWN_PEER 3   /* peer never loaded, or forgotten */
#define BOUNCE_ERR_TIMEOUT 4        /* a bounded wait ended without a result */
#define BOUNCE_ERR_CLOSED 5         /* the agent is closed or closing */
#define BOUNCE_ERR_PEER_LOST 6      /* the peer went away while work was in flight */
#define BOUNCE_ERR_OUT_OF_BOUNDS 7  /* outside registered or granted memory */
#define BOUNCE_ERR_NOT_REGISTERED 8 /* memory never registered */
#define BOUNCE_ERR_IN_USE 9         /* still used by work in flight */
#define BOUNCE_ERR_NOT_QUIESCENT 10 /* no proof that nothing touches the memory: keep it */
#define BOUNCE_ERR_DEVICE_FAULT 11  /* device faulted: never release the memory */
#define BOUNCE_ERR_UNSUPPORTED 12   /* capability not available here */
#define BOUNCE_ERR_FORBIDDEN 13     /* the peer may not write there, or this agent may not pull that */
#define BOUNCE_ERR_BUSY 14          /* backpressure: retry later */
#define BOUNCE_ERR_REFUSED 15       /* the receiver (or a pull's holder) refused, or a required route is unavailable */
#define BOUNCE_ERR_FAILED 16        /* any other failure; the message says why */
#define BOUNCE_ERR_INCOMPATIBLE_LAYOUT 17 /* two pools' KV layouts cannot be converted; the message says why */

/* Memory kinds (bounce_desc.kind, bounce_pool.kind). */
#define BOUNCE_MEM_HOST 0
#define BOUNCE_MEM_CUDA 1

/* Routes (bounce_submit*'s route, bounce_event.route). */
#define BOUNCE_ROUTE_AUTO 0   /* the agent's bounce.route, then its choice */
#define BOUNCE_ROUTE_BOUNCE 1 /* required: fail rather than take direct */
#define BOUNCE_ROUTE_DIRECT 2

/* Batch status (bounce_batch_poll, bounce_batch_wait). */
#define BOUNCE_PENDING 0
#define BOUNCE_DONE 1
#define BOUNCE_FAILED 2

/* Outcomes of bounce_batch_abandon. */
#define BOUNCE_ABANDON_RECOVERABLE 0  /* stopped and quiescent: release the memory */
#define BOUNCE_ABANDON_DEVICE_FAULT 1 /* never release the memory; restart */
#define BOUNCE_ABANDON_NOT_QUIESCENT 2 /* no proof yet: keep waiting, keep the memory */

/* One contiguous piece of memory. */
typedef struct bounce_desc {
	uint64_t addr;
	uint64_t len;
	int32_t device; /* CUDA ordinal; 0 for host memory */
	int32_t kind;   /* BOUNCE_MEM_HOST or BOUNCE_MEM_CUDA */
} bounce_desc;

/* A KV pool: n_regions regions (per layer, or per layer and K/V), each an
 * array of `blocks` equal blocks of block_len bytes at `stride`; block id i
 * is, in region r, block_len bytes at regions[r] + i*stride. */
typedef struct bounce_pool {
	const uint64_t *regions;
	size_t n_regions;
	uint64_t block_len;
	uint64_t stride;
	uint64_t blocks;
	int32_t device;
	int32_t kind;
} bounce_pool;

/* KV axis orders (bounce_layout.order). */
#define BOUNCE_ORDER_NHD 1 /* token-major: a block is [token][head][element] */
#define BOUNCE_ORDER_HND 2 /* head-major: a block is [head][token][element] */

/* What a pool's bytes mean as KV cache. Region r of the pool is layer r / kv,
 * K (r % kv == 0) or V; a block of a region holds `tokens` tokens of the
 * `heads` heads first_head .. first_head+heads-1 of the model (this rank's
 * slice), head_dim elements of elem bytes each, in `order`. The pool must
 * have layers*kv regions and blocks of tokens*heads*head_dim*elem bytes. */
typedef struct bounce_layout {
	uint32_t layers;
	uint32_t kv; /* 1 (K only, or a latent) or 2 (K and V) */
	uint32_t heads;
	uint32_t first_head;
	uint32_t head_dim;
	uint32_t tokens;
	uint32_t elem;
	int32_t order; /* BOUNCE_ORDER_NHD or BOUNCE_ORDER_HND */
} bounce_layout;

/* A receiver-side event: a request a peer sent landed (code BOUNCE_OK) or
 * never will (code and error say why); or, with pull set, a pull a peer
 * made of this agent's memory ended (request is the puller's id, bytes what
 * it acknowledged, code and error a failure's cause; quiescent says no copy
 * still reads the sources, so they may be reused). A refused pull has no
 * event (the holder's stats count it). Release with bounce_event_free. */
typedef struct bounce_event {
	char *peer;
	uint64_t request;
	uint8_t *tag;
	size_t tag_len;
	uint64_t bytes;
	int32_t route;
	bounce_code code;
	char *error;       /* NULL on success */
	int32_t pull;      /* 1: a pull peer made of this agent's memory; 0: a push that landed here */
	int32_t quiescent; /* with pull: 1 when nothing reads the sources any more; 0 for a push */
} bounce_event;

#ifndef BOUNCE_NO_PROTOTYPES /* the library's own build declares them from Go */

/* The ABI version of the loaded library (BOUNCE_ABI_VERSION it was built with). */
int32_t bounce_abi_version(void);

/* Releases memory the library returned. NULL is ignored. */
void bounce_free(void *p);

/* Releases an event's fields (not the struct itself) and zeroes them. */
void bounce_event_free(bounce_event *ev);

/* Creates and starts an agent. yaml is configuration text in the format of
 * `bounce config` (NULL or "" for the defaults); options are n_options
 * "key=value" strings with the keys of `bounce config --keys`, applied over
 * the YAML. The agent keeps up to `events` receiver events for
 * bounce_next_event (0: 4096; an event that finds the queue full is dropped
 * and counted in the stats). */
bounce_code bounce_agent_create(const char *yaml, const char *const *options, size_t n_options,
	size_t events, uint64_t *agent, char **err);

/* Fails what is in flight, waits at most timeout_ms for it to stop, and
 * closes the agent. The handle is invalid afterwards, even on error. */
bounce_code bounce_agent_close(uint64_t agent, int64_t timeout_ms, char **err);

/* The agent's name (agent.name); release with bounce_free. */
bounce_code bounce_agent_name(uint64_t agent, char **name, char **err);

/* The agent's descriptor: the blob a peer passes to bounce_load_peer.
 * *desc is allocated by the library (release with bounce_free). */
bounce_code bounce_descriptor(uint64_t agent, uint8_t **desc, size_t *len, char **err);

/* Loads (or refreshes) a peer from its descriptor; *peer (optional) gets
 * its name, to release with bounce_free. */
bounce_code bounce_load_peer(uint64_t agent, const uint8_t *desc, size_t len, char **peer, char **err);

/* Forgets a peer: its requests fail and none of its bytes land any more. */
bounce_code bounce_forget_peer(uint64_t agent, const char *peer, char **err);

/* Registers memory as a source or a destination peers may write (every
 * admitted peer when for_peer is NULL, else only that one). */
bounce_code bounce_register_memory(uint64_t agent, bounce_desc mem, const char *for_peer, char **err);

/* Deregisters memory; BOUNCE_ERR_IN_USE while a transfer uses it. */
bounce_code bounce_deregister_memory(uint64_t agent, bounce_desc mem, char **err);

/* Registers a pool by name; its regions must lie in registered memory.
 * Peers see it once they load this agent's descriptor again. */
bounce_code bounce_register_pool(uint64_t agent, const char *name, const bounce_pool *pool, char **err);

/* Registers a pool whose KV layout is known: the layout must describe the
 * pool (BOUNCE_ERR_INVALID says why not) and is advertised with it, so a
 * block push between two pools of different layouts (a tensor-parallel split
 * or merge, a block-size change, NHD <-> HND) is converted on the way, or
 * refused at submit with BOUNCE_ERR_INCOMPATIBLE_LAYOUT and the reason
 * (different head size, element size, layer count, no head in common, ids
 * that do not pair as groups), before anything moves. */
bounce_code bounce_register_pool_layout(uint64_t agent, const char *name, const bounce_pool *pool,
	const bounce_layout *layout, char **err);

/* Deregisters a pool; BOUNCE_ERR_IN_USE while a request uses it. */
bounce_code bounce_deregister_pool(uint64_t agent, const char *name, char **err);

/* Submits a push of n descriptors: src[i] (local) to dst[i] (the peer's),
 * tagged with tag (at most 256 bytes, may be NULL). *batch gets the batch. */
bounce_code bounce_submit(uint64_t agent, const char *peer, const bounce_desc *src, const bounce_desc *dst,
	size_t n, const uint8_t *tag, size_t tag_len, int32_t route, uint64_t *batch, char **err);

/* Submits a push of blocks by id: block src_ids[i] of the local pool
 * src_pool to block dst_ids[i] of the peer's pool dst_pool (every region of
 * the pools; destination ids must be distinct). n_src == n_dst, unless the
 * pools' layouts convert with a block-size change: then the ids pair as
 * groups (32 16-token source blocks into 16 32-token destination blocks). */
bounce_code bounce_submit_blocks(uint64_t agent, const char *peer, const char *src_pool, const uint32_t *src_ids,
	size_t n_src, const char *dst_pool, const uint32_t *dst_ids, size_t n_dst, const uint8_t *tag, size_t tag_len,
	int32_t route, uint64_t *batch, char **err);

/* Pulls n descriptors from the peer (decode-initiated): src[i] (the peer's
 * memory) to dst[i] (this agent's, which the peer may write). The peer
 * decides what may be pulled: only memory it registered for this agent or
 * for every peer; anything else fails the batch with BOUNCE_ERR_FORBIDDEN
 * (other refusals: BOUNCE_ERR_REFUSED) and nothing is written. A pull rides
 * the bounce path (BOUNCE_ERR_REFUSED at once when either end has it off).
 * The batch is a push's: wait, retirement, abandon and release apply. */
bounce_code bounce_pull(uint64_t agent, const char *peer, const bounce_desc *src, const bounce_desc *dst, size_t n,
	const uint8_t *tag, size_t tag_len, uint64_t *batch, char **err);

/* Pulls blocks by id: block src_ids[i] of the peer's pool src_pool (one
 * its descriptor advertises) to block dst_ids[i] of the local pool dst_pool
 * (every region; destination ids distinct). A pull does not convert
 * layouts (yet): n_src == n_dst and the pools' block length and region
 * count must be equal, and when both pools have a layout
 * (bounce_register_pool_layout) they must be the same: else
 * BOUNCE_ERR_UNSUPPORTED (BOUNCE_ERR_INCOMPATIBLE_LAYOUT where no conversion
 * exists) before anything moves. The counts are separate so that this
 * signature is bounce_submit_blocks's. */
bounce_code bounce_pull_blocks(uint64_t agent, const char *peer, const char *src_pool, const uint32_t *src_ids,
	size_t n_src, const char *dst_pool, const uint32_t *dst_ids, size_t n_dst, const uint8_t *tag, size_t tag_len,
	uint64_t *batch, char **err);

/* The batch's status, never blocking; a failed batch's cause is in *err. */
bounce_code bounce_batch_poll(uint64_t batch, int32_t *status, char **err);

/* Waits at most timeout_ms (negative: no bound) for the batch to be terminal.
 * Returns BOUNCE_OK when it is Done, the failure's code when it failed, and
 * BOUNCE_ERR_TIMEOUT when it is still pending (*status says which). */
bounce_code bounce_batch_wait(uint64_t batch, int64_t timeout_ms, int32_t *status, char **err);

/* Retirement: retired (terminal) and quiescent (proved that nothing touches
 * the batch's memory any more). */
bounce_code bounce_batch_retirement(uint64_t batch, int32_t *retired, int32_t *quiescent, char **err);

/* Gives the batch up within timeout_ms; *outcome is a BOUNCE_ABANDON_*. */
bounce_code bounce_batch_abandon(uint64_t batch, int64_t timeout_ms, int32_t *outcome, char **err);

/* Releases a terminal, quiescent batch; the handle is invalid afterwards.
 * BOUNCE_ERR_NOT_QUIESCENT (the batch stays valid) means keep its memory. */
bounce_code bounce_batch_release(uint64_t batch, char **err);

/* Waits at most timeout_ms (negative: no bound) for the next receiver
 * event; BOUNCE_ERR_TIMEOUT when none came. */
bounce_code bounce_next_event(uint64_t agent, int64_t timeout_ms, bounce_event *ev, char **err);

/* The agent's counters as a JSON object (release with bounce_free). */
bounce_code bounce_agent_stats(uint64_t agent, char **json, char **err);

#endif /* BOUNCE_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif

#endif /* BOUNCE_H */
