package pipeline

import (
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// TestFairInboxServesSendersInTurn: a sender with a full queue cannot push
// more, and another sender's message is served within one message of the
// flooding one.
func TestFairInboxServesSendersInTurn(t *testing.T) {
	q := newFairInbox()
	for i := 0; i < inboxPerPeer; i++ {
		if !q.push(transfer.Message{Peer: "mallory", Payload: []byte{byte(i)}}) {
			t.Fatalf("push %d refused below the bound", i)
		}
	}
	if q.push(transfer.Message{Peer: "mallory"}) {
		t.Fatal("push past the per-peer bound accepted")
	}
	if !q.push(transfer.Message{Peer: "alice", Payload: []byte("want")}) {
		t.Fatal("another sender refused while one is full")
	}
	var order []string
	for {
		m, ok := q.pop()
		if !ok {
			break
		}
		order = append(order, m.Peer)
	}
	if len(order) != inboxPerPeer+1 {
		t.Fatalf("popped %d messages, want %d", len(order), inboxPerPeer+1)
	}
	if order[0] != "alice" && order[1] != "alice" {
		t.Fatalf("alice's message came at %v..., want within the first two", order[:4])
	}
	// Bytes bound too: one message larger than the byte bound alone is
	// accepted (a single message is bounded by the channel), two are not.
	if !q.push(transfer.Message{Peer: "big", Payload: make([]byte, inboxPerPeerBytes)}) || q.push(transfer.Message{Peer: "big", Payload: []byte{1}}) {
		t.Fatal("byte bound not applied")
	}
}
