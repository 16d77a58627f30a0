package plugins_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// stalledWatch is how long a stalled write is watched for bytes: a 1 MiB
// write that the stall does not hold lands over loopback well within it.
// It bounds nothing the engine does.
const stalledWatch = 300 * time.Millisecond

// TestPluginEngineStalls: transfer.WriteStaller (test-only) crosses the
// plugin boundary. The tcp engine in a plugin process, stalled from the
// host, keeps a write pending with no byte landed at the in-process
// target; once released the write lands byte-exact, and a release again
// changes nothing.
func TestPluginEngineStalls(t *testing.T) {
	bin := buildExample(t)
	const size = 1 << 20
	for how, open := range pluginEngines(t, bin) {
		t.Run(how, func(t *testing.T) {
			target := open(t, "target") // the plugin writes to a plugin: no host engine in between
			e := open(t, "stalled")
			dst, err := mem.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			src, err := mem.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Free()
			for i := range src.Bytes() {
				src.Bytes()[i] = byte(i*7) | 1
			}
			if err := target.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			if err := e.RegisterMemory(src.Desc()); err != nil {
				t.Fatal(err)
			}
			md, err := target.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			peer, err := e.LoadPeer(md)
			if err != nil {
				t.Fatal(err)
			}
			s, ok := e.(transfer.WriteStaller)
			if !ok {
				t.Fatalf("plugin engine %T is no transfer.WriteStaller", e)
			}
			release, err := s.StallWrites()
			if err != nil {
				t.Fatalf("StallWrites: %v", err)
			}
			defer release()
			op, err := e.PostWrite(peer, []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
			if err != nil {
				t.Fatal(err)
			}
			defer op.Release()
			time.Sleep(stalledWatch)
			if st, err := op.Poll(); st != transfer.Pending {
				t.Fatalf("stalled write polled %v, %v; want pending", st, err)
			}
			if !bytes.Equal(dst.Bytes(), make([]byte, size)) {
				t.Fatal("a byte of the stalled write landed")
			}
			release()
			release()
			deadline := time.Now().Add(30 * time.Second)
			for {
				st, err := op.Poll()
				if st.Terminal() {
					if st != transfer.Done || err != nil {
						t.Fatalf("released write: %v, %v; want done", st, err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the released write did not complete within 30s")
				}
				time.Sleep(time.Millisecond)
			}
			if !bytes.Equal(dst.Bytes(), src.Bytes()) {
				t.Fatal("the released write did not land byte-exact")
			}
		})
	}
}

// TestPluginEngineWithoutStaller: a plugin engine that does not declare
// transfer.WriteStaller (testplugin's hide_notify wrapper hides every
// optional method) refuses StallWrites on the host with ErrUnsupported,
// through a bare Client and a supervised one.
func TestPluginEngineWithoutStaller(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	opts := map[string]string{"listen": "127.0.0.1:0", "hide_notify": "true"}
	c, err := plugins.Load(bin, plugins.KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := c.Engine("bare", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	sup, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{}, "sup", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	for how, e := range map[string]transfer.Engine{"bare": bare, "supervised": sup} {
		s, ok := e.(transfer.WriteStaller)
		if !ok {
			t.Fatalf("%s: %T has no StallWrites at all; the host side always has it", how, e)
		}
		if release, err := s.StallWrites(); !errors.Is(err, transfer.ErrUnsupported) || release != nil {
			t.Errorf("%s: StallWrites = %v, %v; want ErrUnsupported and no release", how, release != nil, err)
		}
	}
}
