#include "shim.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static void op_dec(bkv_op *op)
{
    if (--op->pending == 0) {
        op->next     = op->ctx->done;
        op->ctx->done = op;
    }
}

static void op_note(bkv_op *op, ucs_status_t st)
{
    if (st != UCS_OK && op->status == UCS_OK) {
        op->status = st;
    }
}

static void send_cb(void *req, ucs_status_t st, void *user_data)
{
    bkv_op *op = user_data;
    op_note(op, st);
    ucp_request_free(req);
    op_dec(op);
}

/* track accounts for what a non-blocking call returned. */
static ucs_status_t track(bkv_op *op, ucs_status_ptr_t p)
{
    if (p == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(p)) {
        op_note(op, UCS_PTR_STATUS(p));
        return UCS_PTR_STATUS(p);
    }
    op->pending++;
    return UCS_OK;
}

static ucs_status_t am_cb(void *arg, const void *header, size_t hlen, void *data,
                          size_t dlen, const ucp_am_recv_param_t *param)
{
    bkv_ctx *c = arg;
    bkv_msg *m;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* Senders force eager; returning UCS_OK drops a rendezvous offer. */
        c->am_dropped++;
        return UCS_OK;
    }
    m = malloc(sizeof(*m) + hlen + dlen);
    if (m == NULL) {
        c->am_dropped++;
        return UCS_OK;
    }
    m->next = NULL;
    m->hlen = hlen;
    m->dlen = dlen;
    memcpy(m->bytes, header, hlen);
    memcpy(m->bytes + hlen, data, dlen);
    if (c->msg_tail != NULL) {
        c->msg_tail->next = m;
    } else {
        c->msg_head = m;
    }
    c->msg_tail = m;
    return UCS_OK;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    bkv_epinfo *info = arg;
    bkv_eperr  *e    = malloc(sizeof(*e));
    (void)ep;
    if (e == NULL) {
        return; /* the endpoint's requests still fail; only the report is lost */
    }
    e->ep_id        = info->ep_id;
    e->status       = st;
    e->next         = info->ctx->errs;
    info->ctx->errs = e;
}

ucs_status_t bkv_init(bkv_ctx **out, int *efd, size_t *max_am_header)
{
    ucp_params_t          params  = {0};
    ucp_worker_params_t   wparams = {0};
    ucp_worker_attr_t     wattr   = {0};
    ucp_am_handler_param_t am     = {0};
    ucp_config_t         *config;
    ucs_status_t          st;
    bkv_ctx              *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        goto err_free;
    }
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features   = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &c->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        goto err_free;
    }
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(c->context, &wparams, &c->worker);
    if (st != UCS_OK) {
        goto err_ctx;
    }
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    st = ucp_worker_query(c->worker, &wattr);
    if (st != UCS_OK) {
        goto err_worker;
    }
    *max_am_header = wattr.max_am_header;
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id    = BKV_AM_ID;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb    = am_cb;
    am.arg   = c;
    st = ucp_worker_set_am_recv_handler(c->worker, &am);
    if (st != UCS_OK) {
        goto err_worker;
    }
    st = ucp_worker_get_efd(c->worker, efd);
    if (st != UCS_OK) {
        goto err_worker;
    }
    *out = c;
    return UCS_OK;

err_worker:
    ucp_worker_destroy(c->worker);
err_ctx:
    ucp_cleanup(c->context);
err_free:
    free(c);
    return st;
}

void bkv_destroy(bkv_ctx *c)
{
    bkv_msg   *m;
    bkv_eperr *e;

    for (m = bkv_take_msgs(c); m != NULL;) {
        bkv_msg *next = m->next;
        free(m);
        m = next;
    }
    for (e = bkv_take_errs(c); e != NULL;) {
        bkv_eperr *next = e->next;
        free(e);
        e = next;
    }
    ucp_worker_destroy(c->worker);
    ucp_cleanup(c->context);
    free(c);
}

unsigned bkv_progress(bkv_ctx *c)
{
    unsigned total = 0, n, i;
    for (i = 0; i < 64; i++) {
        n = ucp_worker_progress(c->worker);
        total += n;
        if (n == 0) {
            break;
        }
    }
    return total;
}

ucs_status_t bkv_worker_address(bkv_ctx *c, void **addr, size_t *len)
{
    ucp_address_t *a;
    ucs_status_t   st = ucp_worker_get_address(c->worker, &a, len);
    if (st != UCS_OK) {
        return st;
    }
    *addr = malloc(*len);
    if (*addr == NULL) {
        ucp_worker_release_address(c->worker, a);
        return UCS_ERR_NO_MEMORY;
    }
    memcpy(*addr, a, *len);
    ucp_worker_release_address(c->worker, a);
    return UCS_OK;
}

ucs_status_t bkv_mem_map(bkv_ctx *c, uint64_t addr, uint64_t len, ucp_mem_h *memh,
                         void **rkey, size_t *rkey_len)
{
    ucp_mem_map_params_t p = {0};
    void                *packed;
    ucs_status_t         st;

    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address    = (void *)(uintptr_t)addr;
    p.length     = len;
    st = ucp_mem_map(c->context, &p, memh);
    if (st != UCS_OK) {
        return st;
    }
    st = ucp_rkey_pack(c->context, *memh, &packed, rkey_len);
    if (st != UCS_OK) {
        ucp_mem_unmap(c->context, *memh);
        return st;
    }
    *rkey = malloc(*rkey_len);
    if (*rkey == NULL) {
        ucp_rkey_buffer_release(packed);
        ucp_mem_unmap(c->context, *memh);
        return UCS_ERR_NO_MEMORY;
    }
    memcpy(*rkey, packed, *rkey_len);
    ucp_rkey_buffer_release(packed);
    return UCS_OK;
}

ucs_status_t bkv_ep_create(bkv_ctx *c, const void *addr, uint64_t ep_id, int peer_errors,
                           ucp_ep_h *ep, bkv_epinfo **info)
{
    ucp_ep_params_t p = {0};
    ucs_status_t    st;
    bkv_epinfo     *i = malloc(sizeof(*i));

    if (i == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    i->ctx   = c;
    i->ep_id = ep_id;
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address         = addr;
    p.err_mode        = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb  = ep_err_cb;
    p.err_handler.arg = i;
    st = ucp_ep_create(c->worker, &p, ep);
    if (st != UCS_OK) {
        free(i);
        return st;
    }
    *info = i;
    return UCS_OK;
}

void bkv_ep_close(ucp_ep_h ep, bkv_op *op)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    p.cb.send      = send_cb;
    p.user_data    = op;
    track(op, ucp_ep_close_nbx(ep, &p));
}

bkv_op *bkv_op_new(bkv_ctx *c, uint64_t id)
{
    bkv_op *op = calloc(1, sizeof(*op));
    if (op != NULL) {
        op->pending = 1;
        op->status  = UCS_OK;
        op->id      = id;
        op->ctx     = c;
    }
    return op;
}

void bkv_op_post_done(bkv_op *op) { op_dec(op); }

void bkv_op_free(bkv_op *op)
{
    free(op->buf);
    free(op);
}

ucs_status_t bkv_put_many(ucp_ep_h ep, bkv_op *op, const bkv_put *puts, size_t n)
{
    ucp_request_param_t p = {0};
    ucs_status_t        st;
    size_t              i;

    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_MEMH;
    p.cb.send      = send_cb;
    p.user_data    = op;
    for (i = 0; i < n; i++) {
        p.memh = puts[i].memh;
        st = track(op, ucp_put_nbx(ep, (void *)(uintptr_t)puts[i].laddr, puts[i].len,
                                   puts[i].raddr, puts[i].rkey, &p));
        if (st != UCS_OK) {
            return st;
        }
    }
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    return track(op, ucp_ep_flush_nbx(ep, &p));
}

ucs_status_t bkv_am_send(ucp_ep_h ep, bkv_op *op, size_t hlen, size_t dlen)
{
    ucp_request_param_t p = {0};
    char               *b = op->buf;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.flags        = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send      = send_cb;
    p.user_data    = op;
    return track(op, ucp_am_send_nbx(ep, BKV_AM_ID, b, hlen, b + hlen, dlen, &p));
}

bkv_op *bkv_take_done(bkv_ctx *c)
{
    bkv_op *d = c->done;
    c->done   = NULL;
    return d;
}

bkv_msg *bkv_take_msgs(bkv_ctx *c)
{
    bkv_msg *m  = c->msg_head;
    c->msg_head = NULL;
    c->msg_tail = NULL;
    return m;
}

bkv_eperr *bkv_take_errs(bkv_ctx *c)
{
    bkv_eperr *e = c->errs;
    c->errs      = NULL;
    return e;
}

int bkv_status_is_peer(ucs_status_t st)
{
    switch (st) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return 1;
    default:
        return 0;
    }
}

char *bkv_ep_info(ucp_ep_h ep)
{
    char  *buf = NULL;
    size_t len = 0;
    FILE  *f   = open_memstream(&buf, &len);
    if (f == NULL) {
        return NULL;
    }
    ucp_ep_print_info(ep, f);
    fclose(f);
    return buf;
}
