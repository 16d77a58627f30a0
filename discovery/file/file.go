// Package file is the file directory of package discovery: a record is a
// file, its name the file's path (serve --descriptor-out FILE writes one,
// send --peer FILE reads it). Files are written atomically (a temporary
// file and a rename), so a reader never sees half a record. There is no
// lease: a record stays until it is rewritten or removed, and Close of a
// publication leaves it (what a hand-copied descriptor line needs).
// Watch polls the file.
package file

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/google/renameio/v2"

	"github.com/bouncekv/bounce/discovery"
)

// MaxRecord bounds a record file (an agent descriptor is far smaller).
const MaxRecord = 16 << 20

// Directory is a discovery.Directory of files.
type Directory struct {
	// Poll is how often Watch reads a watched file; 0 means 500ms.
	Poll time.Duration
}

var _ discovery.Directory = Directory{}

// Publish writes value to the file name.
func (d Directory) Publish(_ context.Context, name string, value []byte) (discovery.Publication, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty path", discovery.ErrBadName)
	}
	p := publication{path: name}
	return p, p.Update(context.Background(), value)
}

// Lookup reads the file name ("-" is not a path: the caller reads stdin).
func (d Directory) Lookup(_ context.Context, name string) (discovery.Record, error) {
	if name == "" {
		return discovery.Record{}, fmt.Errorf("%w: empty path", discovery.ErrBadName)
	}
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return discovery.Record{}, fmt.Errorf("%w: %w", discovery.ErrNotFound, err)
	}
	if err != nil {
		return discovery.Record{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxRecord+1))
	if err != nil {
		return discovery.Record{}, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > MaxRecord {
		return discovery.Record{}, fmt.Errorf("%s: record exceeds %d bytes", name, MaxRecord)
	}
	h := fnv.New64a()
	h.Write(b)
	return discovery.Record{Name: name, Value: b, Version: int64(h.Sum64() >> 1)}, nil
}

// Watch reports the file's record and each change (a new content, or Gone
// when removed), polling every Poll.
func (d Directory) Watch(ctx context.Context, name string) (<-chan discovery.Event, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty path", discovery.ErrBadName)
	}
	poll := d.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	out := make(chan discovery.Event, 4)
	go func() {
		defer close(out)
		var last int64
		first, gone := true, false
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			rec, err := d.Lookup(ctx, name)
			var ev *discovery.Event
			switch {
			case errors.Is(err, discovery.ErrNotFound):
				if first || !gone {
					ev = &discovery.Event{Gone: true, Record: discovery.Record{Name: name}}
				}
				gone = true
			case err == nil && (first || gone || rec.Version != last):
				ev = &discovery.Event{Record: rec}
				last, gone = rec.Version, false
			}
			first = false
			if ev != nil {
				select {
				case out <- *ev:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Close does nothing: a file directory holds no connection.
func (Directory) Close() error { return nil }

type publication struct{ path string }

// Update rewrites the file atomically.
func (p publication) Update(_ context.Context, value []byte) error {
	return renameio.WriteFile(p.path, value, 0o644)
}

// Close leaves the file (a descriptor line outlives its writer, as
// serve --descriptor-out always did).
func (publication) Close(context.Context) error { return nil }
