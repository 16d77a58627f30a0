package loopback_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// readPair returns a (the reader, its 64 KiB buffer registered) and b (the
// holder, its buffer registered and filled), a knowing b.
func readPair(t *testing.T) (a, b *loopback.Engine, mine, theirs *mem.Buffer, done chan struct{}) {
	a, b, mine, theirs, done = pair(t, loopback.Options{})
	pattern(theirs.Bytes(), 9)
	clear(mine.Bytes())
	return a, b, mine, theirs, done
}

func allowOnly(peer string, r transfer.Desc) transfer.ReadGuard {
	return func(p string, d transfer.Desc) (transfer.Desc, error) {
		if p != peer || !r.Contains(d.Addr, d.Len) {
			return transfer.Desc{}, fmt.Errorf("%q may not read %v: %w", p, d, transfer.ErrForbidden)
		}
		return r, nil
	}
}

// TestReadByteExact: reads of the holder's memory its guard allows land
// exactly, several in one post.
func TestReadByteExact(t *testing.T) {
	a, b, mine, theirs, done := readPair(t)
	b.SetReadGuard(allowOnly("a", theirs.Desc()))
	m, h := mine.Desc(), theirs.Desc()
	op, err := a.PostRead("b", []transfer.ReadOp{{Src: sub(h, 7, 1000), Dst: sub(m, 0, 1000)}, {Src: sub(h, 40000, 1), Dst: sub(m, 2000, 1)}, {}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := await(t, op, done); st != transfer.Done || err != nil {
		t.Fatalf("read = %v, %v", st, err)
	}
	if !bytes.Equal(mine.Bytes()[:1000], theirs.Bytes()[7:1007]) || mine.Bytes()[2000] != theirs.Bytes()[40000] {
		t.Fatal("read bytes differ")
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestReadRefusedReadsNothing: no guard, a guard refusing, another peer's
// range, a read straddling the allowed range: ErrForbidden, nothing read.
func TestReadRefusedReadsNothing(t *testing.T) {
	a, b, mine, theirs, done := readPair(t)
	m, h := mine.Desc(), theirs.Desc()
	read := func(what string, src transfer.Desc) {
		t.Helper()
		op, err := a.PostRead("b", []transfer.ReadOp{{Src: src, Dst: sub(m, 0, src.Len)}})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := await(t, op, done); st != transfer.Failed || !errors.Is(err, transfer.ErrForbidden) {
			t.Fatalf("%s: %v, %v; want ErrForbidden", what, st, err)
		}
		if bytes.ContainsFunc(mine.Bytes(), func(r rune) bool { return r != 0 }) {
			t.Fatalf("%s: a refused read landed bytes", what)
		}
	}
	read("no guard", sub(h, 0, 100))
	b.SetReadGuard(allowOnly("c", h))
	read("a range allowed to another peer", sub(h, 0, 100))
	b.SetReadGuard(allowOnly("a", sub(h, 0, 4096)))
	read("straddling the allowed range", sub(h, 4000, 200))
	read("outside the allowed range", sub(h, 8192, 100))
	if _, err := a.PostRead("b", []transfer.ReadOp{{Src: sub(h, 0, 10), Dst: transfer.Desc{Addr: 0x1000, Len: 10}}}); !errors.Is(err, transfer.ErrNotRegistered) && !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("unregistered destination: %v", err)
	}
}

// TestReadForgetAndClose: a read held in the holder's guard fails at once
// with ErrPeerLost when either side forgets the other (ErrClosed when the
// reader closes), and never lands when the guard answers later; FenceReads
// waits for a read its guard is being asked about.
func TestReadForgetAndClose(t *testing.T) {
	for _, how := range []string{"reader-forgets", "holder-forgets", "reader-closes"} {
		t.Run(how, func(t *testing.T) {
			a, b, mine, theirs, done := readPair(t)
			asked, release := make(chan struct{}, 1), make(chan struct{})
			held := theirs.Desc()
			b.SetReadGuard(func(p string, d transfer.Desc) (transfer.Desc, error) {
				asked <- struct{}{}
				<-release
				return held, nil
			})
			op, err := a.PostRead("b", []transfer.ReadOp{{Src: theirs.Desc(), Dst: mine.Desc()}})
			if err != nil {
				t.Fatal(err)
			}
			<-asked
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			defer unblock()
			// FenceReads waits for a read its guard is being asked about.
			fenced := make(chan struct{})
			go func() { b.FenceReads(theirs.Desc()); close(fenced) }()
			select {
			case <-fenced:
				t.Fatal("FenceReads returned while the guard was still being asked")
			case <-time.After(20 * time.Millisecond):
			}
			want := transfer.ErrPeerLost
			closed := make(chan error, 1)
			switch how {
			case "reader-forgets":
				err = a.ForgetPeer("b")
			case "holder-forgets":
				err = b.ForgetPeer("a")
			case "reader-closes":
				// Close waits for its goroutines, the one in the guard too.
				want = transfer.ErrClosed
				go func() { closed <- a.Close() }()
				eventually(t, func() bool { st, _ := op.Poll(); return st.Terminal() })
			}
			if err != nil {
				t.Fatal(err)
			}
			// Terminal at once, although the guard has not answered: it
			// never copies.
			if st, err := op.Poll(); st != transfer.Failed || !errors.Is(err, want) {
				t.Fatalf("read after %s: %v, %v; want failed with %v", how, st, err, want)
			}
			<-fenced
			unblock()
			if how == "reader-closes" {
				if err := <-closed; err != nil {
					t.Fatal(err)
				}
			}
			_ = done
			time.Sleep(20 * time.Millisecond)
			if bytes.ContainsFunc(mine.Bytes(), func(r rune) bool { return r != 0 }) {
				t.Fatalf("a failed read landed after %s", how)
			}
		})
	}
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 30s")
		}
	}
}
