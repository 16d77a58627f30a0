/* pull.c — pulls through the C ABI: a decode agent pulls 1024 scattered
 * blocks by id (K and V, 4 KiB each) and 64 descriptors from a prefill
 * agent over tcp and ZeroMQ on loopback, checked byte for byte with the
 * blocks outside the request untouched; the holder's event (pull,
 * quiescent, bytes, tag); and refused pulls — a pool and memory the holder
 * registered for another peer — fail with BOUNCE_ERR_FORBIDDEN, write
 * nothing and are counted. Built and run by capi's Go test
 * (TestCPrograms). */
#include "common.h"

#define REGIONS 2
#define BLOCKS 1100
#define N 1024
#define BLOCK 4096
#define REGION ((size_t)BLOCKS * BLOCK)
#define GUARD 0xA5

static uint8_t pattern(size_t r, size_t block, size_t k) { return (uint8_t)(r * 131 + block * 7 + k + (block >> 8)); }

/* pool over a buffer of REGIONS regions of BLOCKS blocks. */
static bounce_pool pool_of(uint8_t *buf, uint64_t *regions) {
	for (int r = 0; r < REGIONS; r++)
		regions[r] = (uint64_t)(uintptr_t)(buf + r * REGION);
	return (bounce_pool){regions, REGIONS, BLOCK, BLOCK, BLOCKS, 0, BOUNCE_MEM_HOST};
}

static int run(void) {
	char *err = NULL;
	bounce_code c;
	uint64_t holder = agent("c-holder"), puller = agent("c-puller");
	size_t size = REGIONS * REGION;
	uint8_t *kv = aligned_alloc(4096, size), *secret = aligned_alloc(4096, size), *in = aligned_alloc(4096, size);
	for (size_t r = 0; r < REGIONS; r++)
		for (size_t b = 0; b < BLOCKS; b++)
			for (size_t k = 0; k < BLOCK; k++) {
				kv[r * REGION + b * BLOCK + k] = pattern(r, b, k);
				secret[r * REGION + b * BLOCK + k] = (uint8_t)~pattern(r, b, k);
			}
	memset(in, GUARD, size);

	/* The holder registers kv for the puller and secret for another peer;
	 * the puller registers its destination pool (every peer may write it). */
	must(bounce_register_memory(holder, (bounce_desc){(uint64_t)(uintptr_t)kv, size, 0, BOUNCE_MEM_HOST}, "c-puller", &err), err, "register kv");
	must(bounce_register_memory(holder, (bounce_desc){(uint64_t)(uintptr_t)secret, size, 0, BOUNCE_MEM_HOST}, "c-other", &err), err, "register secret");
	must(bounce_register_memory(puller, (bounce_desc){(uint64_t)(uintptr_t)in, size, 0, BOUNCE_MEM_HOST}, NULL, &err), err, "register in");
	uint64_t rk[REGIONS], rs[REGIONS], ri[REGIONS];
	bounce_pool pk = pool_of(kv, rk), ps = pool_of(secret, rs), pi = pool_of(in, ri);
	must(bounce_register_pool(holder, "kv", &pk, &err), err, "pool kv");
	must(bounce_register_pool(holder, "secret", &ps, &err), err, "pool secret");
	must(bounce_register_pool(puller, "kv-in", &pi, &err), err, "pool kv-in");
	char *hname = load(puller, holder), *pname = load(holder, puller);
	CHECK(strcmp(hname, "c-holder") == 0 && strcmp(pname, "c-puller") == 0, "names %s %s", hname, pname);

	/* 1024 blocks by id: source block (i*37+5) % BLOCKS to destination
	 * block (i*53+11) % BLOCKS (both permutations of 0..BLOCKS-1 as
	 * BLOCKS = 1100 is coprime to 37 and 53). */
	uint32_t *sid = calloc(N, sizeof *sid), *did = calloc(N, sizeof *did);
	for (uint32_t i = 0; i < N; i++) {
		sid[i] = (i * 37 + 5) % BLOCKS;
		did[i] = (i * 53 + 11) % BLOCKS;
	}
	const char tag[] = "pull-1";
	uint64_t b = 0;
	must(bounce_pull_blocks(puller, hname, "kv", sid, N, "kv-in", did, N, (const uint8_t *)tag, 6, &b, &err), err, "pull_blocks");
	int32_t st = -1, retired = 0, quiet = 0;
	must(bounce_batch_wait(b, 120000, &st, &err), err, "wait pull");
	CHECK(st == BOUNCE_DONE, "pull status %d", st);
	must(bounce_batch_retirement(b, &retired, &quiet, &err), err, "retirement");
	CHECK(retired && quiet, "pull retired %d quiescent %d", retired, quiet);
	must(bounce_batch_release(b, &err), err, "release");

	uint8_t *want = malloc(size);
	memset(want, GUARD, size);
	for (size_t r = 0; r < REGIONS; r++)
		for (int i = 0; i < N; i++)
			memcpy(want + r * REGION + (size_t)did[i] * BLOCK, kv + r * REGION + (size_t)sid[i] * BLOCK, BLOCK);
	for (size_t k = 0; k < size; k++)
		CHECK(in[k] == want[k], "byte %zu (region %zu, block %zu) is %#x, want %#x", k, k / REGION, k % REGION / BLOCK, in[k], want[k]);

	/* The holder reports the pull it served; the puller has no event. */
	bounce_event ev;
	must(bounce_next_event(holder, 60000, &ev, &err), err, "holder event");
	CHECK(ev.code == BOUNCE_OK && ev.pull == 1 && ev.quiescent == 1, "holder event code %d pull %d quiescent %d: %s", ev.code, ev.pull, ev.quiescent, ev.error ? ev.error : "");
	CHECK(strcmp(ev.peer, "c-puller") == 0, "holder event peer %s", ev.peer);
	CHECK(ev.bytes == (uint64_t)N * REGIONS * BLOCK, "holder event bytes %llu", (unsigned long long)ev.bytes);
	CHECK(ev.tag_len == 6 && memcmp(ev.tag, tag, 6) == 0, "holder event tag of %zu bytes", ev.tag_len);
	bounce_event_free(&ev);
	c = bounce_next_event(puller, 200, &ev, &err);
	CHECK(c == BOUNCE_ERR_TIMEOUT, "the puller got an event: code %d", c);
	clear(&err);

	/* Descriptors: 64 scattered 4 KiB pieces of region 1 into block 0 onwards of region 0. */
	enum { D = 64 };
	memset(in, GUARD, size);
	bounce_desc src[D], dst[D];
	for (int i = 0; i < D; i++) {
		src[i] = (bounce_desc){(uint64_t)(uintptr_t)(kv + REGION + (size_t)(BLOCKS - 1 - 3 * i) * BLOCK), BLOCK, 0, BOUNCE_MEM_HOST};
		dst[i] = (bounce_desc){(uint64_t)(uintptr_t)(in + (size_t)i * BLOCK), BLOCK, 0, BOUNCE_MEM_HOST};
	}
	must(bounce_pull(puller, hname, src, dst, D, NULL, 0, &b, &err), err, "pull");
	must(bounce_batch_wait(b, 120000, &st, &err), err, "wait pull descriptors");
	must(bounce_batch_release(b, &err), err, "release");
	for (int i = 0; i < D; i++)
		CHECK(memcmp(in + (size_t)i * BLOCK, kv + REGION + (size_t)(BLOCKS - 1 - 3 * i) * BLOCK, BLOCK) == 0, "descriptor %d differs", i);
	for (size_t k = (size_t)D * BLOCK; k < size; k++)
		CHECK(in[k] == GUARD, "byte %zu changed by the descriptor pull", k);
	must(bounce_next_event(holder, 60000, &ev, &err), err, "holder event");
	CHECK(ev.code == BOUNCE_OK && ev.pull == 1 && ev.bytes == (uint64_t)D * BLOCK, "holder event code %d pull %d bytes %llu", ev.code, ev.pull, (unsigned long long)ev.bytes);
	bounce_event_free(&ev);

	/* Refused: the pool and the memory registered for c-other. The batch
	 * fails with BOUNCE_ERR_FORBIDDEN and the holder's reason; nothing is
	 * written; the holder counts both and reports no event. */
	memset(in, GUARD, size);
	must(bounce_pull_blocks(puller, hname, "secret", sid, N, "kv-in", did, N, NULL, 0, &b, &err), err, "pull secret");
	c = bounce_batch_wait(b, 120000, &st, &err);
	CHECK(c == BOUNCE_ERR_FORBIDDEN && st == BOUNCE_FAILED, "pull of a pool for another peer: code %d status %d", c, st);
	CHECK(err && strstr(err, "pool \"secret\" is not registered for \"c-puller\""), "refusal says %s", err ? err : "NULL");
	clear(&err);
	c = bounce_batch_poll(b, &st, &err);
	CHECK(c == BOUNCE_ERR_FORBIDDEN && st == BOUNCE_FAILED, "poll of the refused pull: code %d status %d", c, st);
	clear(&err);
	must(bounce_batch_retirement(b, &retired, &quiet, &err), err, "retirement");
	CHECK(retired && quiet, "refused pull retired %d quiescent %d", retired, quiet);
	must(bounce_batch_release(b, &err), err, "release refused");
	src[0].addr = (uint64_t)(uintptr_t)secret;
	must(bounce_pull(puller, hname, src, dst, 1, NULL, 0, &b, &err), err, "pull secret memory");
	c = bounce_batch_wait(b, 120000, &st, &err);
	CHECK(c == BOUNCE_ERR_FORBIDDEN && err && strstr(err, "not \"c-puller\""), "pull of memory for another peer: code %d: %s", c, err ? err : "NULL");
	clear(&err);
	must(bounce_batch_release(b, &err), err, "release refused");
	for (size_t k = 0; k < size; k++)
		CHECK(in[k] == GUARD, "byte %zu changed though every pull was refused", k);
	char *js;
	must(bounce_agent_stats(holder, &js, &err), err, "stats");
	CHECK(strstr(js, "\"RefusedPulls\":2") && strstr(js, "\"PullsServed\":2"), "holder stats %s", js);
	bounce_free(js);
	c = bounce_next_event(holder, 200, &ev, &err);
	CHECK(c == BOUNCE_ERR_TIMEOUT, "the holder reported a refused pull: code %d", c);
	clear(&err);

	/* Bad calls: an unknown peer, a pool the peer does not advertise, NULL ids. */
	c = bounce_pull_blocks(puller, "nobody", "kv", sid, 1, "kv-in", did, 1, NULL, 0, &b, &err);
	CHECK(c == BOUNCE_ERR_UNKNOWN_PEER, "pull from an unknown peer: code %d", c);
	clear(&err);
	c = bounce_pull_blocks(puller, hname, "none", sid, 1, "kv-in", did, 1, NULL, 0, &b, &err);
	CHECK(c == BOUNCE_ERR_NOT_REGISTERED && err && strstr(err, "\"none\""), "pull of an unknown pool: code %d", c);
	clear(&err);
	c = bounce_pull_blocks(puller, hname, "kv", NULL, 1, "kv-in", did, 1, NULL, 0, &b, &err);
	CHECK(c == BOUNCE_ERR_INVALID, "NULL ids: code %d", c);
	clear(&err);
	c = bounce_pull_blocks(puller, hname, "kv", sid, 2, "kv-in", did, 1, NULL, 0, &b, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "2 source block ids but 1"), "unequal ids: code %d: %s", c, err ? err : "NULL");
	clear(&err);
	c = bounce_pull(puller, hname, src, dst, 0, NULL, 0, &b, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "nothing to pull"), "empty pull: code %d", c);
	clear(&err);

	bounce_free(hname);
	bounce_free(pname);
	must(bounce_agent_close(puller, 30000, &err), err, "close puller");
	must(bounce_agent_close(holder, 30000, &err), err, "close holder");
	free(kv);
	free(secret);
	free(in);
	free(want);
	free(sid);
	free(did);
	return 0;
}

int main(void) {
	int rc = run();
	if (rc == 0 && failures == 0)
		printf("pull.c: ok\n");
	return rc || failures;
}
