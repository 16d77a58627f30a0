/* layout.c — KV layouts through the C ABI: a prefill rank holding heads
 * 0..3 token-major (NHD) in 16-token blocks pushes by id over tcp and
 * ZeroMQ on loopback to two decode pools: heads 2..3 head-major (HND; a
 * tensor-parallel split and an axis swap, one id for one id) and all four
 * heads in 32-token blocks (two source ids into each destination id).
 * Every element (layer, K/V, token, head, element) is checked where the
 * decode layout puts it, and every byte outside the request's heads and
 * blocks untouched. Layouts that cannot be converted are refused with
 * BOUNCE_ERR_INCOMPATIBLE_LAYOUT and the reason before anything moves; a
 * layout that does not describe its pool with BOUNCE_ERR_INVALID. Built and
 * run by capi's Go test (TestCPrograms). */
#include "common.h"

#define LAYERS 2
#define REGIONS (LAYERS * 2)
#define BLOCKS 64
#define N 32 /* source blocks a request */
#define TOKENS 16
#define HEADS 4
#define HEAD_DIM 8
#define ELEM 2
#define HEAD_LEN (HEAD_DIM * ELEM)
#define GUARD 0xA5

/* value is the byte that byte b of element e of model head h of token t of
 * source block blk of region r holds: a mix of all six, so an element
 * moved anywhere else is caught. */
static uint8_t value(uint32_t r, uint32_t blk, uint32_t t, uint32_t h, uint32_t e, uint32_t b) {
	uint32_t x = ((((r * 64 + blk) * 16 + t) * 8 + h) * 8 + e) * 2 + b;
	x *= 2654435761u;
	return (uint8_t)(x >> 24);
}

/* A pool of one layout over its own buffer of REGIONS x BLOCKS blocks. */
typedef struct kvpool {
	bounce_layout l;
	uint64_t block, regions[REGIONS];
	size_t size;
	uint8_t *buf;
	bounce_pool pool;
} kvpool;

static void kvpool_init(kvpool *p, bounce_layout l) {
	p->l = l;
	p->block = (uint64_t)l.tokens * l.heads * l.head_dim * l.elem;
	p->size = (size_t)REGIONS * BLOCKS * p->block;
	p->buf = aligned_alloc(4096, p->size);
	memset(p->buf, GUARD, p->size);
	for (int r = 0; r < REGIONS; r++)
		p->regions[r] = (uint64_t)(uintptr_t)(p->buf + (size_t)r * BLOCKS * p->block);
	p->pool = (bounce_pool){p->regions, REGIONS, p->block, p->block, BLOCKS, 0, BOUNCE_MEM_HOST};
}

/* at is the byte offset in p's buffer of byte b of element e of model head
 * h of token t of block blk of region r. */
static size_t at(const kvpool *p, uint32_t r, uint32_t blk, uint32_t t, uint32_t h, uint32_t e, uint32_t b) {
	uint32_t lh = h - p->l.first_head;
	size_t in = p->l.order == BOUNCE_ORDER_NHD ? (size_t)t * p->l.heads + lh : (size_t)lh * p->l.tokens + t;
	return ((size_t)r * BLOCKS + blk) * p->block + in * HEAD_LEN + e * ELEM + b;
}

/* check verifies that the request's N source blocks sid, in token order,
 * landed in d's blocks did (the heads d holds), and that no other byte of
 * d changed. */
static int check(const kvpool *d, const uint32_t *sid, const uint32_t *did) {
	uint8_t *want = malloc(d->size);
	memset(want, GUARD, d->size);
	size_t moved = 0;
	for (uint32_t r = 0; r < REGIONS; r++)
		for (uint32_t i = 0; i < N; i++)
			for (uint32_t t = 0; t < TOKENS; t++) {
				uint32_t g = i * TOKENS + t; /* the token's index in the request */
				uint32_t blk = did[g / d->l.tokens], dt = g % d->l.tokens;
				for (uint32_t h = d->l.first_head; h < d->l.first_head + d->l.heads; h++)
					for (uint32_t e = 0; e < HEAD_DIM; e++)
						for (uint32_t b = 0; b < ELEM; b++) {
							size_t k = at(d, r, blk, dt, h, e, b);
							uint8_t v = value(r, sid[i], t, h, e, b);
							CHECK(d->buf[k] == v, "region %u block %u token %u head %u element %u byte %u is %#x, want %#x", r, blk, dt, h, e, b, d->buf[k], v);
							want[k] = v;
							moved++;
						}
			}
	CHECK(moved == (size_t)N * TOKENS * d->l.heads * HEAD_LEN * REGIONS, "checked %zu bytes", moved);
	for (size_t k = 0; k < d->size; k++)
		CHECK(d->buf[k] == want[k], "byte %zu outside the request changed (%#x)", k, d->buf[k]);
	free(want);
	return 0;
}

/* push moves the request into pool name of the peer, ndst ids, and checks
 * the receiver's event. */
static int push(uint64_t send, uint64_t recv, const char *peer, const char *sender, const uint32_t *sid, const char *name,
	const uint32_t *did, size_t ndst, uint64_t want_bytes) {
	char *err = NULL;
	uint64_t b = 0;
	int32_t st = -1;
	must(bounce_submit_blocks(send, peer, "kv", sid, N, name, did, ndst, (const uint8_t *)"conv", 4, BOUNCE_ROUTE_BOUNCE, &b, &err), err, "submit");
	must(bounce_batch_wait(b, 120000, &st, &err), err, "wait");
	must(bounce_batch_release(b, &err), err, "release");
	bounce_event ev;
	must(bounce_next_event(recv, 60000, &ev, &err), err, "next_event");
	CHECK(ev.code == BOUNCE_OK && ev.pull == 0 && strcmp(ev.peer, sender) == 0, "event code %d pull %d peer %s", ev.code, ev.pull, ev.peer);
	CHECK(ev.bytes == want_bytes, "%s: event bytes %llu, want %llu", name, (unsigned long long)ev.bytes, (unsigned long long)want_bytes);
	bounce_event_free(&ev);
	return 0;
}

static int run(void) {
	char *err = NULL;
	bounce_code c;
	uint64_t send = agent("c-tp4"), recv = agent("c-tp2");
	kvpool s, split, grow, odd;
	kvpool_init(&s, (bounce_layout){LAYERS, 2, HEADS, 0, HEAD_DIM, TOKENS, ELEM, BOUNCE_ORDER_NHD});
	kvpool_init(&split, (bounce_layout){LAYERS, 2, 2, 2, HEAD_DIM, TOKENS, ELEM, BOUNCE_ORDER_HND});
	kvpool_init(&grow, (bounce_layout){LAYERS, 2, HEADS, 0, HEAD_DIM, 2 * TOKENS, ELEM, BOUNCE_ORDER_NHD});
	/* The split's block length, but heads of 16 elements: not convertible. */
	kvpool_init(&odd, (bounce_layout){LAYERS, 2, 1, 2, 2 * HEAD_DIM, TOKENS, ELEM, BOUNCE_ORDER_HND});
	for (uint32_t r = 0; r < REGIONS; r++)
		for (uint32_t blk = 0; blk < BLOCKS; blk++)
			for (uint32_t t = 0; t < TOKENS; t++)
				for (uint32_t h = 0; h < HEADS; h++)
					for (uint32_t e = 0; e < HEAD_DIM; e++)
						for (uint32_t b = 0; b < ELEM; b++)
							s.buf[at(&s, r, blk, t, h, e, b)] = value(r, blk, t, h, e, b);
	must(bounce_register_memory(send, (bounce_desc){(uint64_t)(uintptr_t)s.buf, s.size, 0, BOUNCE_MEM_HOST}, NULL, &err), err, "register src");
	kvpool *dsts[] = {&split, &grow, &odd};
	for (int i = 0; i < 3; i++)
		must(bounce_register_memory(recv, (bounce_desc){(uint64_t)(uintptr_t)dsts[i]->buf, dsts[i]->size, 0, BOUNCE_MEM_HOST}, NULL, &err), err, "register dst");

	/* A layout that does not describe its pool, and a bad order, are bad arguments. */
	c = bounce_register_pool_layout(send, "bad", &s.pool, &split.l, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "layout block is"), "a layout not matching its pool: code %d: %s", c, err ? err : "NULL");
	clear(&err);
	bounce_layout lbad = s.l;
	lbad.order = 7;
	c = bounce_register_pool_layout(send, "bad", &s.pool, &lbad, &err);
	CHECK(c == BOUNCE_ERR_INVALID && err && strstr(err, "order 7"), "order 7: code %d: %s", c, err ? err : "NULL");
	clear(&err);
	c = bounce_register_pool_layout(send, "bad", &s.pool, NULL, &err);
	CHECK(c == BOUNCE_ERR_INVALID, "NULL layout: code %d", c);
	clear(&err);

	must(bounce_register_pool_layout(send, "kv", &s.pool, &s.l, &err), err, "pool kv");
	must(bounce_register_pool_layout(recv, "kv-split", &split.pool, &split.l, &err), err, "pool kv-split");
	must(bounce_register_pool_layout(recv, "kv-32", &grow.pool, &grow.l, &err), err, "pool kv-32");
	must(bounce_register_pool_layout(recv, "kv-odd", &odd.pool, &odd.l, &err), err, "pool kv-odd");
	char *peer = load(send, recv), *sender = load(recv, send);

	uint32_t sid[N], did[N];
	for (uint32_t i = 0; i < N; i++) {
		sid[i] = (i * 5 + 3) % BLOCKS;
		did[i] = (i * 7 + 1) % BLOCKS;
	}

	/* Incompatible: refused at submit, with the reason, and no batch. */
	uint64_t b = 0;
	c = bounce_submit_blocks(send, peer, "kv", sid, N, "kv-odd", did, N, NULL, 0, BOUNCE_ROUTE_BOUNCE, &b, &err);
	CHECK(c == BOUNCE_ERR_INCOMPATIBLE_LAYOUT && err && strstr(err, "heads of 8 elements against 16"), "incompatible layouts: code %d: %s", c, err ? err : "NULL");
	CHECK(b == 0, "a refused submit returned batch %llu", (unsigned long long)b);
	clear(&err);
	/* 16-token blocks into 32-token ones pair as groups: 32 ids into 15 do not. */
	c = bounce_submit_blocks(send, peer, "kv", sid, N, "kv-32", did, N / 2 - 1, NULL, 0, BOUNCE_ROUTE_BOUNCE, &b, &err);
	CHECK(c == BOUNCE_ERR_INCOMPATIBLE_LAYOUT && err && strstr(err, "do not pair as groups"), "ids not in groups: code %d: %s", c, err ? err : "NULL");
	clear(&err);

	/* The TP split and NHD -> HND: heads 2..3 of each token land head-major. */
	if (push(send, recv, peer, sender, sid, "kv-split", did, N, (uint64_t)N * REGIONS * split.block) || check(&split, sid, did))
		return 1;
	/* 16 -> 32 tokens a block: source ids 2j and 2j+1 fill destination id did[j]. */
	if (push(send, recv, peer, sender, sid, "kv-32", did, N / 2, (uint64_t)N / 2 * REGIONS * grow.block) || check(&grow, sid, did))
		return 1;
	for (size_t k = 0; k < odd.size; k++)
		CHECK(odd.buf[k] == GUARD, "byte %zu of the incompatible pool changed", k);

	bounce_free(peer);
	bounce_free(sender);
	must(bounce_agent_close(send, 30000, &err), err, "close send");
	must(bounce_agent_close(recv, 30000, &err), err, "close recv");
	for (int i = 0; i < 3; i++)
		free(dsts[i]->buf);
	free(s.buf);
	return 0;
}

int main(void) {
	int rc = run();
	if (rc == 0 && failures == 0)
		printf("layout.c: ok\n");
	return rc || failures;
}
