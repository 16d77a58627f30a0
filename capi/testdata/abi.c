/* abi.c — the C ABI's test: two agents in one process over tcp and ZeroMQ
 * on loopback move 1024 scattered 4 KiB blocks; the receiver's event and
 * every byte are checked, and bad calls get their codes. Built and run by
 * capi's Go test (TestCPrograms); exits non-zero with a message on the
 * first failure. */
#include "common.h"

#define N 1024
#define BLOCK 4096

static int run(void) {
	char *err = NULL;
	CHECK(bounce_abi_version() == BOUNCE_ABI_VERSION, "abi version %d, header %d", bounce_abi_version(), BOUNCE_ABI_VERSION);

	/* Bad input: an unknown key is BOUNCE_ERR_INVALID with a message naming it. */
	const char *bad[] = {"engine.knd=tcp"};
	uint64_t none = 0;
	bounce_code c = bounce_agent_create(NULL, bad, 1, 0, &none, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "engine.knd"), "unknown key: code %d, message %s", c, err ? err : "NULL");
	bounce_free(err);
	err = NULL;
	c = bounce_batch_poll(12345, &(int32_t){0}, &err);
	CHECK(c == BOUNCE_ERR_BAD_HANDLE, "stale batch handle: code %d", c);
	bounce_free(err);
	err = NULL;

	uint64_t send = agent("c-prefill"), recv = agent("c-decode");
	uint8_t *src = aligned_alloc(4096, N * BLOCK), *dst = aligned_alloc(4096, N * BLOCK + 2 * BLOCK);
	for (size_t i = 0; i < (size_t)N * BLOCK; i++)
		src[i] = (uint8_t)(i * 7 + i / BLOCK);
	memset(dst, 0xA5, N * BLOCK + 2 * BLOCK);
	bounce_desc s = {(uint64_t)(uintptr_t)src, N * BLOCK, 0, BOUNCE_MEM_HOST};
	bounce_desc d = {(uint64_t)(uintptr_t)dst, N * BLOCK + 2 * BLOCK, 0, BOUNCE_MEM_HOST};
	must(bounce_register_memory(send, s, NULL, &err), err, "register src");
	must(bounce_register_memory(recv, d, NULL, &err), err, "register dst");

	uint8_t *blob;
	size_t n;
	char *peer;
	bounce_desc sv_dummy[1] = {{s.addr, 1, 0, BOUNCE_MEM_HOST}};
	must(bounce_descriptor(recv, &blob, &n, &err), err, "descriptor recv");
	must(bounce_load_peer(send, blob, n, &peer, &err), err, "load recv");
	CHECK(strcmp(peer, "c-decode") == 0, "loaded peer %s", peer);
	bounce_free(blob);
	must(bounce_descriptor(send, &blob, &n, &err), err, "descriptor send");
	char *sender;
	must(bounce_load_peer(recv, blob, n, &sender, &err), err, "load send");
	bounce_free(blob);

	/* Lengths past the ABI's bounds are refused, never cast or allocated. */
	uint64_t nb = 0;
	uint32_t one_id = 0;
	c = bounce_submit(send, peer, sv_dummy, sv_dummy, 1, (const uint8_t *)"t", (size_t)1 << 40, BOUNCE_ROUTE_AUTO, &nb, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "tag_len"), "huge tag_len: code %d", c);
	bounce_free(err);
	err = NULL;
	c = bounce_submit_blocks(send, peer, "kv", &one_id, SIZE_MAX, "kv", &one_id, 1, NULL, 0, BOUNCE_ROUTE_AUTO, &nb, &err);
	CHECK(c == BOUNCE_ERR_INVALID, "SIZE_MAX ids: code %d", c);
	bounce_free(err);
	err = NULL;
	c = bounce_load_peer(send, (const uint8_t *)"x", SIZE_MAX, NULL, &err);
	CHECK(c == BOUNCE_ERR_INVALID, "SIZE_MAX descriptor: code %d", c);
	bounce_free(err);
	err = NULL;

	/* Block i goes to block N-1-i, one block past the start (a guard block
	 * on each side must stay untouched). */
	bounce_desc *sv = calloc(N, sizeof *sv), *dv = calloc(N, sizeof *dv);
	for (int i = 0; i < N; i++) {
		sv[i] = (bounce_desc){s.addr + (uint64_t)i * BLOCK, BLOCK, 0, BOUNCE_MEM_HOST};
		dv[i] = (bounce_desc){d.addr + (uint64_t)(N - i) * BLOCK, BLOCK, 0, BOUNCE_MEM_HOST};
	}
	const char tag[] = "req-7";
	uint64_t b = 0;
	must(bounce_submit(send, peer, sv, dv, N, (const uint8_t *)tag, 5, BOUNCE_ROUTE_BOUNCE, &b, &err), err, "submit");
	int32_t st = -1;
	must(bounce_batch_wait(b, 60000, &st, &err), err, "wait");
	CHECK(st == BOUNCE_DONE, "status %d after wait", st);
	int32_t retired = 0, quiet = 0;
	must(bounce_batch_retirement(b, &retired, &quiet, &err), err, "retirement");
	CHECK(retired && quiet, "retired %d quiescent %d", retired, quiet);
	must(bounce_batch_release(b, &err), err, "release");
	c = bounce_batch_release(b, &err);
	CHECK(c == BOUNCE_ERR_BAD_HANDLE, "released handle still valid: code %d", c);
	bounce_free(err);
	err = NULL;

	bounce_event ev;
	must(bounce_next_event(recv, 60000, &ev, &err), err, "next_event");
	CHECK(ev.code == BOUNCE_OK && ev.error == NULL, "event code %d: %s", ev.code, ev.error ? ev.error : "");
	CHECK(strcmp(ev.peer, sender) == 0, "event peer %s, want %s", ev.peer, sender);
	CHECK(ev.tag_len == 5 && memcmp(ev.tag, tag, 5) == 0, "event tag of %zu bytes", ev.tag_len);
	CHECK(ev.bytes == (uint64_t)N * BLOCK, "event bytes %llu", (unsigned long long)ev.bytes);
	CHECK(ev.route == BOUNCE_ROUTE_BOUNCE, "event route %d", ev.route);
	CHECK(ev.pull == 0 && ev.quiescent == 0, "a push's event says pull %d quiescent %d", ev.pull, ev.quiescent);
	bounce_event_free(&ev);
	CHECK(ev.peer == NULL, "event_free left the peer");

	for (int i = 0; i < N; i++)
		CHECK(memcmp(dst + (size_t)(N - i) * BLOCK, src + (size_t)i * BLOCK, BLOCK) == 0, "block %d differs", i);
	for (int i = 0; i < BLOCK; i++)
		CHECK(dst[i] == 0xA5 && dst[(size_t)(N + 1) * BLOCK + i] == 0xA5, "guard byte %d changed", i);

	char *js;
	must(bounce_agent_stats(send, &js, &err), err, "stats");
	CHECK(strstr(js, "\"Succeeded\":1") != NULL, "stats %s", js);
	bounce_free(js);

	/* Out of bounds: a destination past the peer's memory is refused before anything moves. */
	dv[0].addr = d.addr + d.len;
	c = bounce_submit(send, peer, sv, dv, 1, NULL, 0, BOUNCE_ROUTE_DIRECT, &b, &err);
	if (c == BOUNCE_OK) {
		c = bounce_batch_wait(b, 60000, &st, &err);
		CHECK(st == BOUNCE_FAILED, "out-of-bounds write did not fail (status %d)", st);
		bounce_batch_release(b, NULL);
	}
	CHECK(c == BOUNCE_ERR_OUT_OF_BOUNDS || c == BOUNCE_ERR_NOT_REGISTERED || c == BOUNCE_ERR_FORBIDDEN, "out-of-bounds write: code %d (%s)", c, err ? err : "");
	bounce_free(err);
	err = NULL;

	bounce_free(peer);
	bounce_free(sender);
	must(bounce_agent_close(send, 30000, &err), err, "close send");
	must(bounce_agent_close(recv, 30000, &err), err, "close recv");
	c = bounce_agent_close(send, 1000, &err);
	CHECK(c == BOUNCE_ERR_BAD_HANDLE, "closed agent still valid: code %d", c);
	bounce_free(err);
	free(src);
	free(dst);
	free(sv);
	free(dv);
	return 0;
}

int main(void) {
	int rc = run();
	if (rc == 0 && failures == 0)
		printf("abi.c: ok\n");
	return rc || failures;
}
