/* common.h — what the C test programs share: CHECK (report and fail the
 * current function), must (exit on a failed call), an agent on loopback
 * over tcp and ZeroMQ with the bounce route required, and the connection
 * of two agents (each loads the other's descriptor). */
#ifndef BOUNCE_TEST_COMMON_H
#define BOUNCE_TEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounce.h"

static int failures;

#define CHECK(cond, ...)                                  \
	do {                                                  \
		if (!(cond)) {                                    \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                 \
			fprintf(stderr, "\n");                        \
			failures++;                                   \
			return 1;                                     \
		}                                                 \
	} while (0)

static inline bounce_code must(bounce_code c, char *err, const char *what) {
	if (c != BOUNCE_OK) {
		fprintf(stderr, "%s: code %d: %s\n", what, c, err ? err : "(no message)");
		bounce_free(err);
		exit(1);
	}
	return c;
}

static inline uint64_t agent(const char *name) {
	char opt[128];
	snprintf(opt, sizeof opt, "agent.name=%s", name);
	const char *opts[] = {opt, "engine.kind=tcp", "engine.listen=127.0.0.1:0",
		"control_plane.bind_address=127.0.0.1", "bounce.route=bounce"};
	uint64_t a = 0;
	char *err = NULL;
	must(bounce_agent_create("bounce:\n  arena_size: 64MiB\n", opts, 5, 0, &a, &err), err, "agent_create");
	return a;
}

/* load makes `into` load `from`'s descriptor (as registered now) and
 * returns from's name (release with bounce_free). */
static inline char *load(uint64_t into, uint64_t from) {
	uint8_t *blob;
	size_t n;
	char *peer, *err = NULL;
	must(bounce_descriptor(from, &blob, &n, &err), err, "descriptor");
	must(bounce_load_peer(into, blob, n, &peer, &err), err, "load_peer");
	bounce_free(blob);
	return peer;
}

/* clear frees and resets an error message. */
static inline void clear(char **err) {
	bounce_free(*err);
	*err = NULL;
}

#endif
