package plugins_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// levelRecords are the records of a text log at level (slog's level=
// attribute) that contain s.
func levelRecords(log, level, s string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level="+level+" ") && strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// stageLoad starts testplugin's gather stage with opts and logs at debug
// level into logs; it returns the stage and a one-run copy to gather.
func stageLoad(t *testing.T, bin string, logs *logBuffer, opts map[string]string) (*plugins.Client, transfer.Gatherer, transfer.Desc, []transfer.Run) {
	t.Helper()
	l := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := plugins.Load(bin, plugins.KindGather, l)
	if err != nil {
		t.Fatal(err)
	}
	src, err := mem.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	dst, err := mem.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Free() })
	reg := &mem.Registry{}
	for _, d := range []transfer.Desc{src.Desc(), dst.Desc()} {
		if err := reg.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	g, err := c.Gatherer("a", opts, reg)
	if err != nil {
		t.Fatal(err)
	}
	return c, g, dst.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: 1}}
}

// TestPluginStderrAfterServe: what a plugin writes to stderr once
// plugins.Serve runs — from its constructor (os.Stderr and the log
// package), its ops, its Close and its crash — reaches the host's log, one
// record per line tagged with the plugin's name; go-plugin's own lines are
// debug records with their message, never escaped JSON at info.
func TestPluginStderrAfterServe(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	var logs logBuffer
	c, g, region, runs := stageLoad(t, bin, &logs, map[string]string{"chatty": "true"})
	op, err := g.Gather(region, runs)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := pollDone(t, op); st != transfer.Done {
		t.Fatalf("gather: %v %v", st, err)
	}
	op.Release()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, want := range []string{"testplugin: open gather", "testplugin: log from open gather", "testplugin: gather op", "testplugin: close gather"} {
		logs.waitLog(t, want)
		if r := levelRecords(logs.String(), "INFO", want); len(r) != 1 || !strings.Contains(r[0], "plugin=testplugin") {
			t.Errorf("want one info record %q tagged plugin=testplugin, got %q", want, r)
		}
	}
	out := logs.String()
	if strings.Contains(out, "@level") || strings.Contains(out, `\"@message`) {
		t.Errorf("go-plugin's JSON lines logged raw:\n%s", out)
	}
	if r := levelRecords(out, "DEBUG", "plugin address"); len(r) == 0 {
		t.Errorf("go-plugin's own lines are not debug records:\n%s", out)
	}

	// A crash: the line written just before and the panic itself.
	var crash logBuffer
	c2, g2, region, runs := stageLoad(t, bin, &crash, map[string]string{"crash": "true"})
	defer c2.Close()
	if op, err := g2.Gather(region, runs); err == nil {
		pollDone(t, op)
		op.Release()
	}
	deadline := time.Now().Add(10 * time.Second)
	for !c2.Exited() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	g2.Close()
	crash.waitLog(t, "testplugin: crashing")
	crash.waitLog(t, "crashes on purpose")
	if r := levelRecords(crash.String(), "ERROR", "panic: testplugin: gather crashes on purpose"); len(r) != 1 {
		t.Errorf("the panic is not one error record:\n%s", crash.String())
	}
}

// pollDone polls op until it is terminal (bounded).
func pollDone(t *testing.T, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := op.Poll()
		if st.Terminal() || time.Now().After(deadline) {
			return st, err
		}
		time.Sleep(2 * time.Millisecond)
	}
}
