//go:build nixl

// The C++ side of the engine: a thin C ABI over nixlAgent (see shim.h). It
// keeps no state of its own beyond the agent; the Go side serialises calls.

#include "shim.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <nixl.h>

struct bnx_agent {
    nixlAgent agent;
    nixlBackendH *backend = nullptr;

    bnx_agent(const std::string &name, const nixlAgentConfig &cfg) : agent(name, cfg) {}
};

static char *dup_bytes(const void *p, size_t n) {
    char *out = static_cast<char *>(std::malloc(n ? n : 1));
    if (out && n) std::memcpy(out, p, n);
    return out;
}

#define BNX_TRY try {
#define BNX_CATCH \
    } catch (...) { return BNX_EXCEPTION; }

extern "C" {

int bnx_agent_new(const char *name, size_t name_len, int prog_thread,
                  const char *const *keys, const char *const *vals, size_t nparams,
                  bnx_agent **out, char **what) {
    *out = nullptr;
    *what = nullptr;
    bnx_agent *a = nullptr;
    try {
        nixlAgentConfig cfg(prog_thread != 0);
        a = new bnx_agent(std::string(name, name_len), cfg);
        nixl_b_params_t params;
        for (size_t i = 0; i < nparams; i++) params[keys[i]] = vals[i];
        nixl_status_t st = a->agent.createBackend("UCX", params, a->backend);
        if (st != NIXL_SUCCESS) {
            delete a;
            return st;
        }
    } catch (const std::exception &e) {
        delete a;
        *what = dup_bytes(e.what(), std::strlen(e.what()) + 1);
        return BNX_EXCEPTION;
    } catch (...) {
        delete a;
        return BNX_EXCEPTION;
    }
    *out = a;
    return NIXL_SUCCESS;
}

void bnx_agent_free(bnx_agent *a) {
    try {
        delete a;
    } catch (...) {
    }
}

static int reg(bnx_agent *a, uint64_t addr, uint64_t len, bool add) {
    BNX_TRY
    nixl_reg_dlist_t l(DRAM_SEG);
    l.addDesc(nixlBlobDesc(static_cast<uintptr_t>(addr), static_cast<size_t>(len), 0, nixl_blob_t()));
    return add ? a->agent.registerMem(l) : a->agent.deregisterMem(l);
    BNX_CATCH
}

int bnx_register(bnx_agent *a, uint64_t addr, uint64_t len) { return reg(a, addr, len, true); }

int bnx_deregister(bnx_agent *a, uint64_t addr, uint64_t len) { return reg(a, addr, len, false); }

int bnx_local_md(bnx_agent *a, void **md, size_t *md_len) {
    *md = nullptr;
    *md_len = 0;
    BNX_TRY
    nixl_blob_t blob;
    nixl_status_t st = a->agent.getLocalMD(blob);
    if (st != NIXL_SUCCESS) return st;
    *md = dup_bytes(blob.data(), blob.size());
    if (!*md) return BNX_EXCEPTION;
    *md_len = blob.size();
    return NIXL_SUCCESS;
    BNX_CATCH
}

int bnx_load_md(bnx_agent *a, const void *md, size_t md_len, char **name, size_t *name_len) {
    *name = nullptr;
    *name_len = 0;
    BNX_TRY
    nixl_blob_t blob(static_cast<const char *>(md), md_len);
    std::string remote;
    nixl_status_t st = a->agent.loadRemoteMD(blob, remote);
    if (st != NIXL_SUCCESS) return st;
    *name = dup_bytes(remote.data(), remote.size());
    if (!*name) return BNX_EXCEPTION;
    *name_len = remote.size();
    return NIXL_SUCCESS;
    BNX_CATCH
}

int bnx_invalidate(bnx_agent *a, const char *name, size_t name_len) {
    BNX_TRY
    return a->agent.invalidateRemoteMD(std::string(name, name_len));
    BNX_CATCH
}

int bnx_write(bnx_agent *a, const char *peer, size_t peer_len,
              const uint64_t *laddr, const uint64_t *raddr, const uint64_t *lens, size_t n,
              bnx_xfer **out, int *posted) {
    *out = nullptr;
    *posted = 0;
    BNX_TRY
    nixl_xfer_dlist_t local(DRAM_SEG), remote(DRAM_SEG);
    for (size_t i = 0; i < n; i++) {
        local.addDesc(nixlBasicDesc(static_cast<uintptr_t>(laddr[i]), static_cast<size_t>(lens[i]), 0));
        remote.addDesc(nixlBasicDesc(static_cast<uintptr_t>(raddr[i]), static_cast<size_t>(lens[i]), 0));
    }
    nixlXferReqH *req = nullptr;
    nixl_status_t st = a->agent.createXferReq(NIXL_WRITE, local, remote, std::string(peer, peer_len), req);
    if (st != NIXL_SUCCESS) return st;
    *posted = 1;
    st = a->agent.postXferReq(req);
    if (st == NIXL_SUCCESS || st == NIXL_IN_PROG) {
        *out = reinterpret_cast<bnx_xfer *>(req);
        return st;
    }
    // NIXL 0.1.1 frees the request itself on these two answers.
    if (st != NIXL_ERR_NOT_FOUND && st != NIXL_ERR_REPOST_ACTIVE) a->agent.releaseXferReq(req);
    return st;
    BNX_CATCH
}

int bnx_xfer_status(bnx_agent *a, bnx_xfer *x) {
    BNX_TRY
    return a->agent.getXferStatus(reinterpret_cast<nixlXferReqH *>(x));
    BNX_CATCH
}

int bnx_xfer_release(bnx_agent *a, bnx_xfer *x) {
    BNX_TRY
    return a->agent.releaseXferReq(reinterpret_cast<nixlXferReqH *>(x));
    BNX_CATCH
}

int bnx_notify(bnx_agent *a, const char *peer, size_t peer_len, const void *msg, size_t msg_len) {
    BNX_TRY
    return a->agent.genNotif(std::string(peer, peer_len), nixl_blob_t(static_cast<const char *>(msg), msg_len));
    BNX_CATCH
}

static void put_u32(std::string &s, uint32_t v) {
    char b[4] = {char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
    s.append(b, 4);
}

int bnx_get_notifs(bnx_agent *a, void **buf, size_t *buf_len, size_t *count) {
    *buf = nullptr;
    *buf_len = 0;
    *count = 0;
    BNX_TRY
    nixl_notifs_t notifs;
    nixl_status_t st = a->agent.getNotifs(notifs);
    std::string flat;
    size_t c = 0;
    for (const auto &kv : notifs) {
        for (const auto &m : kv.second) {
            put_u32(flat, uint32_t(kv.first.size()));
            flat += kv.first;
            put_u32(flat, uint32_t(m.size()));
            flat += m;
            c++;
        }
    }
    if (c > 0) {
        *buf = dup_bytes(flat.data(), flat.size());
        if (!*buf) return BNX_EXCEPTION;
        *buf_len = flat.size();
        *count = c;
    }
    return st;
    BNX_CATCH
}

}  // extern "C"
