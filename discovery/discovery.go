// Package discovery is how agents find each other: an agent publishes its
// record (its descriptor line: the agent descriptor with engine metadata,
// capability handshake, control endpoint and public key, plus what the
// application adds) under its name in a Directory, and peers resolve it by
// name, follow its changes and forget it when it goes away.
//
// The Directory interface is owned here, by Peers, the wiring that keeps an
// agent's loaded peers in step with a directory. Two implementations live
// in subpackages: discovery/file (a record is a file: today's serve
// --descriptor-out and send --peer FILE) and discovery/etcd (records under
// <prefix>/agents/<name> in an etcd cluster, each on a lease its agent keeps
// alive; a name is refused while a live agent holds it).
package discovery

import (
	"context"
	"errors"
)

// Record is one agent's published entry.
type Record struct {
	// Name is the name the record is published and looked up under.
	Name string
	// Value is the published bytes, opaque to the directory.
	Value []byte
	// Version changes whenever Value is published again (etcd: the key's
	// modification revision; file: a hash of the contents).
	Version int64
}

// Event is one change of a watched name: a new Record, or Gone when it was
// withdrawn or its lease expired.
type Event struct {
	Record Record
	Gone   bool
}

// Directory is where agents publish themselves and look each other up.
type Directory interface {
	// Publish makes value findable under name until the Publication is
	// closed (etcd: or its lease expires). A name a live agent holds is
	// refused with an error wrapping ErrDuplicate.
	Publish(ctx context.Context, name string, value []byte) (Publication, error)
	// Lookup returns name's current record, an error wrapping ErrNotFound
	// when there is none, or one wrapping ErrUnavailable when the
	// directory cannot be reached.
	Lookup(ctx context.Context, name string) (Record, error)
	// Watch reports name's current state (a record, or Gone when absent)
	// and then every change, until ctx ends, when the channel is closed.
	Watch(ctx context.Context, name string) (<-chan Event, error)
	// Close releases the directory's connections; publications made
	// through it stop being kept alive.
	Close() error
}

// Publication is one published record.
type Publication interface {
	// Update publishes value in place of the record's current value (an
	// agent whose engine metadata grew as memory was registered).
	Update(ctx context.Context, value []byte) error
	// Close withdraws the record.
	Close(ctx context.Context) error
}

// Errors the directories wrap.
var (
	// ErrNotFound: no record under the name.
	ErrNotFound = errors.New("discovery: no such agent")
	// ErrDuplicate: a live agent holds the name.
	ErrDuplicate = errors.New("discovery: name held by a live agent")
	// ErrUnavailable: the directory could not be reached.
	ErrUnavailable = errors.New("discovery: directory unavailable")
	// ErrBadName: the name cannot be a record's name.
	ErrBadName = errors.New("discovery: bad agent name")
	// ErrRefused: a record that is not an agent's (etcd: one without a
	// lease) or whose descriptor names another agent than the one it is
	// published under.
	ErrRefused = errors.New("discovery: record refused")
)
