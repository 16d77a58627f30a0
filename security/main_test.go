package security_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
)

// childEnv selects a child role when the test binary is re-executed.
const childEnv = "BOUNCE_SECURITY_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := childproc.Role(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// runChild is the "recv" child: a receiver node named recv in its own
// process, with its key from BOUNCE_SECURITY_TEST_KEY, the peers of
// BOUNCE_SECURITY_TEST_ALLOWED admitted, a buffer of
// BOUNCE_SECURITY_TEST_SIZE bytes registered for alice alone and 1 MiB
// registered for every peer. With BOUNCE_SECURITY_TEST_ADVERTISE its
// engine advertises that address (a proxy in front of it). It prints
// "LISTEN <addr>", "DESC <hex>", "ALICE <addr>", "OPEN <addr>", "ARENA
// <addr> <len>", then answers on stdin:
//
//	SUM   -> "SUM <sha256 of alice's buffer>"
//	STATS -> "STATS <BadRuns> <FencedWrites> <ForbiddenWrites>"
//	FDS   -> "FDS <open file descriptors> <control messages received> <reverse control paths>"
//	CAPS  -> "CAPS <open file descriptors> <control connections refused over a cap>"
//
// BOUNCE_SECURITY_TEST_MODE sets security.mode.
// It closes the node and exits 0 at end of input.
func runChild(role string) int {
	if role != "recv" {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	size, err := strconv.Atoi(os.Getenv("BOUNCE_SECURITY_TEST_SIZE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad size:", err)
		return 2
	}
	cfg := config.Default()
	cfg.Agent.Name = "recv"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	cfg.Bounce.ArenaSize = 8 * config.MiB
	cfg.Bounce.MaxChunk = 2 * config.MiB
	cfg.Bounce.RequestTimeout = 20 * time.Second
	cfg.Engine.FrameTimeout = time.Minute
	cfg.Security.KeyFile = os.Getenv("BOUNCE_SECURITY_TEST_KEY")
	cfg.Security.AllowedPeers = os.Getenv("BOUNCE_SECURITY_TEST_ALLOWED")
	if m := os.Getenv("BOUNCE_SECURITY_TEST_MODE"); m != "" {
		cfg.Security.Mode = m
	}
	if a := os.Getenv("BOUNCE_SECURITY_TEST_ADVERTISE"); a != "" {
		// The engine's Addr is then the proxy's: listen on a port known
		// here (free a moment ago).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		cfg.Engine.Listen = ln.Addr().String()
		ln.Close()
		cfg.Engine.Options = map[string]string{"advertise": a}
	}
	n, err := node.Build(cfg, node.Builtin(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Close(context.Background())
	alice, err := mem.Alloc(uint64(size))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	open, err := mem.Alloc(1 << 20)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := n.Agent.RegisterMemoryFor(alice.Desc(), "alice"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := n.Agent.RegisterMemory(open.Desc()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	desc, err := n.Agent.Descriptor()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	eng := n.Engine.(*tcp.Engine)
	arena := n.Agent.Arena()
	listen := eng.Addr()
	if cfg.Engine.Listen != "" {
		listen = cfg.Engine.Listen
	}
	fmt.Printf("LISTEN %s\nDESC %s\nALICE %d\nOPEN %d\nARENA %d %d\n", listen, hex.EncodeToString(desc), alice.Desc().Addr, open.Desc().Addr, arena.Addr, arena.Len)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "SUM":
			fmt.Printf("SUM %x\n", sha256.Sum256(alice.Bytes()))
		case "STATS":
			es := eng.Stats()
			fmt.Printf("STATS %d %d %d\n", n.Agent.Stats().BadRuns, es.FencedWrites, es.ForbiddenWrites)
		case "FDS":
			ents, _ := os.ReadDir("/proc/self/fd")
			fmt.Printf("FDS %d %d %d\n", len(ents), n.Control.(*zmq.Channel).Stats().Received, n.Agent.Stats().ControlPeers)
		case "CAPS":
			ents, _ := os.ReadDir("/proc/self/fd")
			fmt.Printf("CAPS %d %d\n", len(ents), n.Control.(*zmq.Channel).Refusals()["over_cap"])
		default:
			fmt.Println("ERR unknown command", in.Text())
		}
	}
	return 0
}
