/* Thin C layer over libucp for package ucx. Every function here is called
 * from the engine's single progress thread; the callbacks run inside
 * ucp_worker_progress on that same thread, so nothing here takes a lock.
 * Callbacks only record facts (a finished request, a received message, an
 * endpoint error) in lists the Go side drains after each progress call. */
#ifndef BKV_SHIM_H
#define BKV_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

typedef struct bkv_ctx bkv_ctx;

/* bkv_op tracks one Go-level operation made of any number of UCX requests.
 * pending starts at 1 (a guard the Go side drops after posting); each request
 * that did not complete immediately adds 1 and its callback subtracts 1. At
 * zero the op moves to ctx's done list. status keeps the first error. */
typedef struct bkv_op {
    int64_t        pending;
    ucs_status_t   status;
    uint64_t       id;
    void          *buf; /* freed with the op (active-message bytes) */
    bkv_ctx       *ctx;
    struct bkv_op *next;
} bkv_op;

/* A received active message: hlen header bytes then dlen data bytes. */
typedef struct bkv_msg {
    struct bkv_msg *next;
    size_t          hlen;
    size_t          dlen;
    char            bytes[];
} bkv_msg;

/* An endpoint error reported by UCX's error handler. */
typedef struct bkv_eperr {
    struct bkv_eperr *next;
    uint64_t          ep_id;
    ucs_status_t      status;
} bkv_eperr;

/* Error-handler argument of one endpoint; freed after the endpoint closed. */
typedef struct bkv_epinfo {
    bkv_ctx *ctx;
    uint64_t ep_id;
} bkv_epinfo;

/* One put: len bytes from local laddr to remote raddr. */
typedef struct bkv_put {
    uint64_t   laddr;
    uint64_t   raddr;
    uint64_t   len;
    ucp_rkey_h rkey;
    ucp_mem_h  memh;
} bkv_put;

struct bkv_ctx {
    ucp_context_h context;
    ucp_worker_h  worker;
    bkv_op       *done;       /* finished ops, LIFO */
    bkv_msg      *msg_head;   /* received messages, FIFO */
    bkv_msg      *msg_tail;
    bkv_eperr    *errs;       /* endpoint errors, LIFO */
    uint64_t      am_dropped; /* messages dropped in the handler */
};

#define BKV_AM_ID 0x6b76

ucs_status_t bkv_init(bkv_ctx **out, int *efd, size_t *max_am_header);
void         bkv_destroy(bkv_ctx *c);
unsigned     bkv_progress(bkv_ctx *c);

ucs_status_t bkv_worker_address(bkv_ctx *c, void **addr, size_t *len);
ucs_status_t bkv_mem_map(bkv_ctx *c, uint64_t addr, uint64_t len, ucp_mem_h *memh,
                         void **rkey, size_t *rkey_len);

ucs_status_t bkv_ep_create(bkv_ctx *c, const void *addr, uint64_t ep_id, int peer_errors,
                           ucp_ep_h *ep, bkv_epinfo **info);
void         bkv_ep_close(ucp_ep_h ep, bkv_op *op);

bkv_op      *bkv_op_new(bkv_ctx *c, uint64_t id);
void         bkv_op_post_done(bkv_op *op);
void         bkv_op_free(bkv_op *op);
ucs_status_t bkv_put_many(ucp_ep_h ep, bkv_op *op, const bkv_put *puts, size_t n);
ucs_status_t bkv_am_send(ucp_ep_h ep, bkv_op *op, size_t hlen, size_t dlen);

bkv_op      *bkv_take_done(bkv_ctx *c);
bkv_msg     *bkv_take_msgs(bkv_ctx *c);
bkv_eperr   *bkv_take_errs(bkv_ctx *c);

int          bkv_status_is_peer(ucs_status_t st);
char        *bkv_ep_info(ucp_ep_h ep); /* malloc'd ucp_ep_print_info text */

static inline char *bkv_msg_bytes(bkv_msg *m) { return m->bytes; }

#endif
