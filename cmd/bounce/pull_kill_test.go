package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// TestKillHolderMidPull: the holder process ('serve --stdin-control',
// its buffer filled) is killed with kill -9 while an in-process agent
// pulls 8 requests from it. Every pull resolves, retired and quiescent,
// within killResolveBound (the loss is noticed, not waited out), and the
// puller pulls byte-exact from a holder restarted at the same address.
func TestKillHolderMidPull(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	cfg := config.Default()
	cfg.Agent.Name = "puller"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	cfg.Bounce.ArenaSize = 64 * config.MiB
	cfg.Security.KeyFile = filepath.Join(t.TempDir(), "puller.key")
	self, _, err := security.LoadOrCreate(cfg.Security.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Build(cfg, node.Builtin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.Spec{DescSize: 4096, Count: 16384, Fragmented: true, Seed: 3}
	const reqs = 8
	dst, err := mem.Alloc(reqs * spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	defer n.Close(context.Background())
	if err := n.Agent.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	own, err := n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(freePort(t))
	var holdErr syncBuffer
	start := func() (*exec.Cmd, hello) {
		hold := exec.Command(cliBinary(t), "serve", "--stdin-control", "--agent.name", "holder", "--buffer-size", "512MiB",
			"--security.allowed-peers", "loaded,puller="+self.Public.String(), "--engine.listen", listen, "--control-plane.bind-address", "127.0.0.1")
		stdout, _ := hold.StdoutPipe()
		hold.Stderr = &holdErr
		stdin, err := hold.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close() })
		if err := hold.Start(); err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(stdout)
		line, err := rd.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var h hello
		if err := json.Unmarshal(line, &h); err != nil {
			t.Fatal(err)
		}
		// The holder loads the puller (it writes into its arena) and
		// fills its buffer with the requests' bytes.
		enc := json.NewEncoder(stdin)
		fc := verifyCommand(spec, reqs)
		fc.Op = "fill"
		for _, c := range []command{{Op: "load", Descriptor: base64.StdEncoding.EncodeToString(own)}, fc} {
			if err := enc.Encode(c); err != nil {
				t.Fatal(err)
			}
			var rep reply
			b, err := rd.ReadBytes('\n')
			if err == nil {
				err = json.Unmarshal(b, &rep)
			}
			if err != nil || !rep.OK {
				t.Fatalf("holder %s: %v %s\n%s", c.Op, err, rep.Error, holdErr.String())
			}
		}
		blob, _ := base64.StdEncoding.DecodeString(h.Descriptor)
		if _, err := n.Agent.LoadPeer(blob); err != nil {
			t.Fatal(err)
		}
		return hold, h
	}
	pull := func(h hello) []*pipeline.Batch {
		var bs []*pipeline.Batch
		for i := range reqs {
			s := spec
			s.Seed += uint64(i)
			hb, db := transfer.Desc{Addr: h.BufferAddr, Len: h.BufferLen}, dst.Desc()
			hb.Addr += uint64(i) * spec.Bytes()
			db.Addr += uint64(i) * spec.Bytes()
			sd, dd := s.Descs(hb, db)
			b, err := n.Agent.Pull(pipeline.PullRequest{Peer: h.Name, Src: sd, Dst: dd})
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		return bs
	}
	var resolve []time.Duration
	failedPulls := 0
	for round := 0; round < *killRounds; round++ {
		hold, h := start()
		bs := pull(h)
		time.Sleep(time.Duration(10+20*round) * time.Millisecond) // mid-pull
		killed := time.Now()
		hold.Process.Signal(syscall.SIGKILL)
		for i, b := range bs {
			ctx, cancel := context.WithTimeout(context.Background(), killResolveBound-time.Since(killed))
			err := b.Wait(ctx)
			cancel()
			if ctx.Err() != nil && err != nil && b.Status() == transfer.Pending {
				hold.Wait()
				t.Fatalf("round %d: pull %d unresolved %v after kill -9 of the holder (the loss was not noticed)", round, i, killResolveBound)
			}
			select { // a scatter into the pull's memory may still end
			case <-b.Quiescent():
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: pull %d never quiescent", round, i)
			}
			resolve = append(resolve, time.Since(killed))
			if err != nil {
				failedPulls++
			}
			if err := b.Release(); err != nil {
				t.Fatal(err)
			}
		}
		hold.Wait()
		if err := n.Agent.ForgetPeer(h.Name); err != nil {
			t.Logf("forget: %v", err)
		}
	}
	if failedPulls == 0 {
		t.Fatal("every pull had ended before its holder was killed: nothing was killed mid-pull")
	}
	hold, h := start()
	defer hold.Process.Kill()
	clear(dst.Bytes())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, b := range pull(h) {
		if err := b.Wait(ctx); err != nil {
			t.Fatalf("pull %d from the restarted holder: %v\nholder stderr:\n%s", i, err, holdErr.String())
		}
	}
	for i := range reqs {
		s := spec
		s.Seed += uint64(i)
		if err := s.Verify(dst.Bytes()[uint64(i)*spec.Bytes():]); err != nil {
			t.Fatalf("pull %d from the restarted holder: %v", i, err)
		}
	}
	if err := n.Agent.CheckConservation(); err != nil {
		t.Fatal(err)
	}
	// Between tcp engines pulls read the holder's staged regions
	// (bounce.pull_read auto): the kills above hit reads in flight.
	if st := n.Agent.Stats(); st.PullReads == 0 {
		t.Fatalf("no chunk was read from the holder's staging: %+v", st)
	}
	t.Logf("kill -9 of the holder: pulls resolved %s, %d failed", quantiles(resolve), failedPulls)
}

// TestKillPullerMidPull: a 'bounce pull' process is killed with kill -9
// while it pulls from an in-process holder. The holder ends every pull it
// served (a failed, quiescent Pull event each) within killReclaimBound,
// its arena back to free, and serves the next puller process.
func TestKillPullerMidPull(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "puller.key")
	pid, _, err := security.LoadOrCreate(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Agent.Name = "holder"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	cfg.Security.AllowedPeers = "loaded,puller=" + pid.Public.String()
	events := make(chan pipeline.Received, 4096)
	n, err := node.BuildWith(cfg, node.Builtin(), node.Options{Received: events})
	if err != nil {
		t.Fatal(err)
	}
	spec := workload.Spec{DescSize: 4096, Count: 16384, Fragmented: true, Seed: 1}
	const reqs = 4
	buf, err := driver.AllocHost(reqs * spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	defer n.Close(context.Background())
	if err := n.Agent.RegisterMemory(buf.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := driver.FillBuffer(buf, spec, reqs); err != nil {
		t.Fatal(err)
	}
	blob, err := n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	on, _ := n.Agent.BounceEnabled()
	line, _ := json.Marshal(hello{Name: "holder", Descriptor: base64.StdEncoding.EncodeToString(blob), BufferAddr: buf.Desc().Addr, BufferLen: buf.Desc().Len, Bounce: on})
	holdFile := filepath.Join(dir, "hold.json")
	if err := os.WriteFile(holdFile, append(line, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	runPuller := func(round int, repeat int) (*exec.Cmd, *syncBuffer) {
		pullFile := filepath.Join(dir, "pull-"+strconv.Itoa(round)+".json")
		var out syncBuffer
		c := exec.Command(cliBinary(t), "pull", "--peer", holdFile, "--descriptor-out", pullFile, "--agent.name", "puller", "--security.key-file", keyFile,
			"--control-plane.bind-address", "127.0.0.1", "--bounce.arena-size", "32MiB", "--desc-size", "4KiB", "--count", "16384", "--seed", "1",
			"--requests", strconv.Itoa(reqs), "--repeat", strconv.Itoa(repeat))
		c.Stdout, c.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		// The holder loads the puller's line as it appears (what serve
		// --follow FILE does).
		deadline := time.Now().Add(30 * time.Second)
		for {
			if b, err := os.ReadFile(pullFile); err == nil {
				if d, err := helloDescriptor(b); err == nil {
					if _, err := n.Agent.LoadPeer(d); err != nil {
						t.Fatal(err)
					}
					break
				}
			}
			if time.Now().After(deadline) {
				c.Process.Kill()
				c.Wait()
				t.Fatalf("the puller wrote no descriptor line:\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return c, &out
	}
	var reclaim []time.Duration
	for round := 0; round < *killRounds; round++ {
		c, out := runPuller(round, 1000)
		// Mid-pull: the holder served a pull or two already.
		served := 0
		deadline := time.After(60 * time.Second)
		for served < 2 {
			select {
			case ev := <-events:
				if ev.Pull && ev.Err == nil {
					served++
				}
			case <-deadline:
				c.Process.Kill()
				c.Wait()
				t.Fatalf("round %d: the holder served no pull in 60s:\n%s", round, out.String())
			}
		}
		killed := time.Now()
		c.Process.Signal(syscall.SIGKILL)
		c.Wait()
		for {
			st := n.Agent.Stats()
			as := n.Agent.ArenaStats()
			if st.Requests == 0 && as.Flows == 0 && as.FreeBytes+as.QuarantinedBytes == as.Capacity {
				break
			}
			if time.Since(killed) > killReclaimBound {
				t.Fatalf("round %d: %v after kill -9 the holder still serves the dead puller: %+v %+v", round, killReclaimBound, st, as)
			}
			time.Sleep(5 * time.Millisecond)
		}
		reclaim = append(reclaim, time.Since(killed))
		// Every pull it ended was reported: the failed ones quiescent.
		for len(events) > 0 {
			if ev := <-events; ev.Pull && ev.Err != nil && !ev.Quiescent && !errors.Is(ev.Err, transfer.ErrNotQuiescent) {
				t.Fatalf("round %d: a failed pull not quiescent: %+v", round, ev)
			}
		}
		if err := n.Agent.ForgetPeer("puller"); err != nil {
			t.Logf("forget: %v", err)
		}
	}
	if err := n.Agent.CheckConservation(); err != nil {
		t.Fatal(err)
	}
	if st := n.Agent.Stats(); st.PullReadOffers == 0 {
		t.Fatalf("the holder offered no chunk to read (tcp engines read: bounce.pull_read auto): %+v", st)
	}
	// The next puller process is served, every byte verified on its side.
	c, out := runPuller(*killRounds, 1)
	if err := c.Wait(); err != nil {
		t.Fatalf("puller after the kills: %v\n%s", err, out.String())
	}
	t.Logf("kill -9 of the puller: the holder's pulls ended %s", quantiles(reclaim))
}
