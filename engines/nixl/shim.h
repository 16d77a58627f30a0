/*
 * A C ABI over NIXL's C++ agent (nixl.h) for the Go engine. Every function
 * returns a nixl_status_t value (0 = NIXL_SUCCESS, 1 = NIXL_IN_PROG, negative
 * = error) or BNX_EXCEPTION when NIXL threw. Nothing here is thread-safe: the
 * caller serialises every call on one agent (NIXL's agent is not).
 */
#ifndef BOUNCE_NIXL_SHIM_H
#define BOUNCE_NIXL_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A C++ exception escaped a NIXL call (out of memory, invalid argument). */
#define BNX_EXCEPTION (-1000)

typedef struct bnx_agent bnx_agent;
typedef struct bnx_xfer bnx_xfer;

/* Creates an agent and its UCX backend with nparams key/value parameters.
 * On failure *out is NULL and, for BNX_EXCEPTION, *what (malloc'd) says why. */
int bnx_agent_new(const char *name, size_t name_len, int prog_thread,
                  const char *const *keys, const char *const *vals, size_t nparams,
                  bnx_agent **out, char **what);
/* Destroys the agent (and its backend). Every transfer must be released. */
void bnx_agent_free(bnx_agent *a);

/* Registers / deregisters one DRAM range with the agent's backends. */
int bnx_register(bnx_agent *a, uint64_t addr, uint64_t len);
int bnx_deregister(bnx_agent *a, uint64_t addr, uint64_t len);

/* getLocalMD into a malloc'd buffer. */
int bnx_local_md(bnx_agent *a, void **md, size_t *md_len);
/* loadRemoteMD; the remote agent's name comes back malloc'd. */
int bnx_load_md(bnx_agent *a, const void *md, size_t md_len, char **name, size_t *name_len);
/* invalidateRemoteMD. */
int bnx_invalidate(bnx_agent *a, const char *name, size_t name_len);

/* createXferReq(NIXL_WRITE) of n DRAM pieces (lens[i] bytes from laddr[i]
 * to raddr[i] at the peer) without a notification, then postXferReq.
 * *posted says whether postXferReq was reached; on a failed post the request
 * is released (or, where NIXL already freed it, forgotten) and *out is NULL. */
int bnx_write(bnx_agent *a, const char *peer, size_t peer_len,
              const uint64_t *laddr, const uint64_t *raddr, const uint64_t *lens, size_t n,
              bnx_xfer **out, int *posted);
/* getXferStatus. NIXL 0.1.1 frees the request when it answers
 * NIXL_ERR_NOT_FOUND; the caller must not use it afterwards. */
int bnx_xfer_status(bnx_agent *a, bnx_xfer *x);
/* releaseXferReq. */
int bnx_xfer_release(bnx_agent *a, bnx_xfer *x);

/* genNotif. */
int bnx_notify(bnx_agent *a, const char *peer, size_t peer_len, const void *msg, size_t msg_len);
/* getNotifs, flattened into one malloc'd buffer (NULL when none) of records
 * u32 name length | name | u32 message length | message; *count records. */
int bnx_get_notifs(bnx_agent *a, void **buf, size_t *buf_len, size_t *count);

#ifdef __cplusplus
}
#endif

#endif
