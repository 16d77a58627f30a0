// Package security holds what bounce needs to trust a peer: the agent's
// identity (one X25519 key pair, the key type ZeroMQ CURVE uses, so the same
// key authenticates the control plane and the tcp engine), the set of
// admitted peers (which public key belongs to which agent name), and the
// per-peer limit bookkeeping (token buckets, fair shares, connections per
// host) as pure logic.
//
// Keys are written and read in Z85, ZeroMQ's text encoding of 32-byte keys
// (40 characters). docs/SECURITY.md describes the threat model, the keys'
// life cycle and the limits.
package security
