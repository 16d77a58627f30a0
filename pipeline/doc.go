// Package pipeline is the bounce runtime: one Agent per process, sender and
// receiver at once, moving transfers through gather → write → scatter with
// credit flow control (WANT / GRANT / DATA / ACK).
//
// An Agent runs one reactor goroutine that owns the credit scheduler and the
// request tables, plus a fixed set of scatter workers. Callers submit from any
// goroutine and get a Batch back; Submit never blocks. Every batch reaches
// Done or Failed (peer loss, timeouts, engine or stage errors, shutdown), and
// its Retirement reports whether the caller's buffers are provably no longer
// touched (quiescent). Release refuses a batch that is not quiescent.
//
// Routing: a transfer takes the bounce path when the peer passed the
// capability handshake and the descriptor count and average size pass the
// configured gates; otherwise it takes the direct path (one engine post of
// every descriptor), which is byte-equivalent.
package pipeline
