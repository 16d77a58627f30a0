// Package ucx is a transfer.Engine and transfer.Notifier over UCX (libucp
// and libucs) through a thin cgo layer of its own (shim.c, shim.h).
//
// # Build
//
// The package needs cgo (CGO_ENABLED=1, a C compiler) and the UCX
// development files: on Debian `apt-get install libucx-dev`, found through
// `pkg-config ucx` (-lucp -luct -lucs -lucm). It was written and tested
// against Debian's UCX 1.13.1. `ucx_info` and `ucx_perftest` come with the
// separate package ucx-utils.
//
// # Threads
//
// Every UCX object (context, worker, endpoints, rkeys, memory handles) is
// created and used by one progress goroutine locked to its OS thread; the
// worker runs in UCS_THREAD_MODE_SINGLE. Public methods hand that goroutine
// a command and wait for its answer, except Notify, which only queues. UCX
// callbacks run inside ucp_worker_progress on the same thread and merely
// record facts in C lists (a finished request, a received active message,
// an endpoint error) that the goroutine drains after each progress call.
// While requests are outstanding the goroutine spins through up to 256
// empty progress rounds, then sleeps on the worker's event fd
// (ucp_worker_get_efd + ucp_worker_arm + epoll, together with an eventfd
// that wakes it for commands) for at most 1 ms; with nothing outstanding it
// sleeps until an event or 100 ms pass, so an idle engine uses no CPU.
//
// # Writes
//
// PostWrite checks every source against this engine's registered memory
// (a mem.Registry) and every destination against the ranges in the peer's
// last loaded metadata, then posts one ucp_put_nbx per fragment of at most
// Config.FragmentSize bytes and one ucp_ep_flush_nbx. The Op is Done when
// every put and the flush completed without error, so the bytes are visible
// at the target; it becomes terminal (Done or Failed) only after UCX called
// back every request it made, so a terminal Op no longer reads its sources.
// A write whose endpoint failed before its completion was handled is
// Failed (ErrPeerLost) whatever status UCX gave it: UCX completes the
// requests of a failed endpoint, the flush included, without the target's
// acknowledgement (measured: a target closed mid-write, an 8 MiB write
// reported done with 2 MB of its destination not written).
//
// # Notifications
//
// Notify sends one active message (forced eager, id 0x6b76) whose header
// carries the sender's name; the receiving handler copies it into a bounded
// queue read by RecvNotification. LoadPeer, and the first notification on
// an endpoint made from a hello, send a hello carrying the sender's UCX
// worker address, so a receiver that never loaded the sender creates an
// endpoint back and can answer it by name (the reverse control path). Such
// a peer can be notified but not written to before its metadata is loaded.
// Messages on one endpoint arrive in order.
//
// Close says bye (an active message without data) to every peer it loaded,
// wrote to, notified or heard from, and waits, within DrainTimeout, for the
// ack of each peer that surely holds an endpoint back (one it heard from or
// sent a hello: every loaded one, since LoadPeer says hello, even if
// nothing was exchanged after: TestIdleLoadedPeerCloseLogsNoWarn). A loaded
// peer that is gone but not yet detected (no endpoint error) holds Close
// up to DrainTimeout. The peer marks the closer departed before it acks — its
// writes and notifications to it fail at once with ErrPeerLost ("closed its
// engine") — and the closer's worker goes only after the ack, so the
// peer's endpoint failing then ("Endpoint timeout" on tcp) is logged at
// Debug as the closer's end; so is any endpoint failure while the engine
// itself closes. A bye alone did not do: nothing orders a message on one
// endpoint against the error callback of another, and the peer logged the
// failure first (TestCloseWaitsForByeAck holds the peer's progress
// goroutine while the other closes). A clean run ends without a warning
// (TestCleanCloseLogsNoWarn, and `bounce run` in cmd/bounce's
// TestRunTwoProcesses); a killed peer says no bye and is still logged as a
// failed endpoint at Warn (TestChildKilledMidWrite).
//
// # Metadata
//
// Metadata is "BKVU", version 1, flags, the name, the worker address and
// each registered range {addr, len, packed rkey}, followed by a CRC-32C.
// LoadPeer rejects anything malformed with ErrBadMetadata before UCX sees
// it; UCX itself does not bound-check worker addresses or rkeys, so the
// checksum is what keeps a corrupted blob away from it.
//
// # What UCX 1.13.1 does here (measured on this repository's 2-core machine)
//
// Transports. With UCX_TLS unset UCX offers self, tcp (lo; tests set
// UCX_NET_DEVICES=lo so nothing leaves loopback), sysv, posix and cma.
// ucp_ep_create with UCP_ERR_HANDLING_MODE_PEER (ErrMode PeerErrors, the
// default) does not fail on shared memory: UCX silently builds the endpoint
// on tcp alone, because its shared-memory transports lack peer-failure
// support. ErrMode NoPeerErrors (UCP_ERR_HANDLING_MODE_NONE) gets
// sysv (active messages), posix and cma lanes, but the shared-memory
// transports do not detect a dead peer (its writes may never complete: the
// caller must ForgetPeer it), and a UCX transport may abort on an error it
// has no way to report. EndpointInfo prints the lanes of a peer's endpoint.
//
// Puts are emulated. For memory registered with ucp_mem_map at an existing
// address, every ucp_put_nbx is a software emulation over active messages
// on every transport available here (UCX_PROTO_ENABLE=y UCX_PROTO_INFO=y
// prints "software emulation" for tcp and for sysv; cma is only a
// rendezvous lane). Three consequences: the target's progress goroutine
// must run for a write to complete (it always does); the target's UCX
// copies to whatever address the writer sends, so bounds are enforced only
// by the writer's PostWrite checks; and the target answers every put with
// an acknowledgement. FragmentSize made no measurable difference between
// 64 KiB and 64 MiB, since UCX cuts the emulated put into 8 KiB messages.
//
// Known aborts in UCX 1.13.1. (1) When a writer's worker disappears while
// its target still processes emulated puts from it, the target's UCX fails
// to send the acknowledgement and calls ucs_fatal ("ucp_request.inl:346
// Fatal: unexpected error: Endpoint timeout", from ucp_put_handler). Seen
// here when a writer process was killed mid-write (3 of 5 runs) and on
// every run when a writer destroyed its worker under a paused target; the
// same code is on UCX master. This engine's Close therefore drains
// in-flight work (DrainTimeout) before it force-closes endpoints, and
// ForgetPeer keeps the worker alive, so the late acknowledgements reach it
// and are dropped. A writer that crashes can still take its target down:
// production use across processes needs a UCX build with hardware RMA
// transports (InfiniBand/RoCE), where puts are one-sided, or a write path
// over active messages. (2) An assertion in ucp_request_send_state_ff ("got
// REP message") aborts a process whose connection-setup reply is pending
// when the other worker disappears; it is removed upstream by
// openucx/ucx#8175, which 1.13.1 lacks. The tests finish connection setup
// before they pause or stop a target for this reason.
//
// Bytes of a cancelled write (ForgetPeer, Close) that were already inside
// the transport may still land in the target's memory afterwards; the
// writer's Op is terminal and its sources are free, but the target must
// treat the destination as possibly written (the bounce orphan rule).
//
// Deregistering memory is not a fence against remote writes either: the
// emulated put copies to the address the writer names.
//
// Target-side ForgetPeer is no fence, and the engine does not implement
// transfer.Fencer: it closes this engine's endpoint to the peer, but the
// peer's emulated puts arrive on the peer's own endpoint to this worker,
// and UCX 1.13 offers no call that refuses a remote worker's puts. Measured
// with the conformance suite: a write the peer posts after the forget is
// neither refused nor completed — it stays pending past the suite's 10 s
// OpTimeout. A pipeline over this engine must quarantine a forgotten
// peer's regions before it grants them again; the conformance rule
// engine/target-forget is skipped for ucx with this reason.
//
// Conformance: on UCX 1.13.1 with emulated puts the engine passes every
// engine rule but five, for the reasons above: engine/deregister-in-flight
// and engine/deregister-idle (the target copies to whatever address the
// writer names, so deregistered memory stays writable), engine/source-forget
// and engine/forget-peer (bytes of a write cancelled by ForgetPeer may land
// after its op reported ErrPeerLost; the op should wrap ErrNotQuiescent
// instead, which is not done yet) and engine/target-forget (target-side
// ForgetPeer cannot refuse the peer's puts). They are waived in
// certify.Waivers, the one list bounce conformance and the Go
// certification both skip, each with its reason in the report; with
// hardware RMA transports all of them should be rechecked.
package ucx
