package plugins

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

// countingHandler counts records by level.
type countingHandler struct{ debug, info, errs atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level <= slog.LevelDebug:
		h.debug.Add(1)
	case r.Level < slog.LevelError:
		h.info.Add(1)
	default:
		h.errs.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// FuzzPluginStderr feeds a plugin's raw stderr, split into writes at
// arbitrary points, to the line logger: it never panics, makes at most one
// record per line (plus a runaway line's pieces), and a go-plugin JSON line
// is a record at its level, never an info record of escaped JSON.
func FuzzPluginStderr(f *testing.F) {
	f.Add([]byte("{\"@level\":\"debug\",\"@message\":\"plugin address\",\"@timestamp\":\"2026-12-02T04:50:32.596167Z\",\"address\":\"/tmp/p\",\"network\":\"unix\"}\n"), uint8(7))
	f.Add([]byte("testplugin: started\r\npanic: boom\n\ngoroutine 1 [running]:\nmain.main()\n"), uint8(3))
	f.Add([]byte("{\"@level\":5}\n{not json\n{\"@message\":\"x\"}\n"), uint8(1))
	f.Add([]byte("2026/12/02 04:50:32 a log line without newline"), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, split uint8) {
		var h countingHandler
		w := &lineLogger{l: slog.New(&h), name: "p", raw: true}
		step := int(split)%17 + 1
		for i := 0; i < len(data); i += step {
			w.Write(data[i:min(i+step, len(data))])
		}
		w.flush()
		lines := int64(bytes.Count(data, []byte{'\n'})) + 1 + int64(len(data)/(64<<10))
		if n := h.debug.Load() + h.info.Load() + h.errs.Load(); n > lines {
			t.Fatalf("%d records for %d lines", n, lines)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if _, _, _, ok := hclogLine(strings.TrimRight(line, "\r")); ok && h.debug.Load()+h.errs.Load()+h.info.Load() == 0 {
				t.Fatalf("go-plugin line %q made no record", line)
			}
		}
	})
}
