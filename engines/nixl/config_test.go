package nixl

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Name: "a"}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	if ok.MaxNotifySize != DefaultMaxNotifySize || ok.RecvQueue != DefaultRecvQueue ||
		ok.PollInterval != DefaultPollInterval || ok.DrainTimeout != DefaultDrainTimeout || ok.Logger == nil {
		t.Fatalf("defaults not applied: %+v", ok)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Name"},
		{Config{Name: strings.Repeat("x", 256)}, "Name"},
		{Config{Name: "a\x00b"}, "Name"},
		{Config{Name: "a", Backend: map[string]string{"": "x"}}, "Backend"},
		{Config{Name: "a", Backend: map[string]string{"k": "\x00"}}, "Backend"},
		{Config{Name: "a", MaxNotifySize: -1}, "MaxNotifySize"},
		{Config{Name: "a", MaxNotifySize: 1<<20 + 1}, "MaxNotifySize"},
		{Config{Name: "a", RecvQueue: -1}, "RecvQueue"},
		{Config{Name: "a", PollInterval: -time.Second}, "PollInterval"},
		{Config{Name: "a", DrainTimeout: -time.Second}, "DrainTimeout"},
	} {
		err := tc.cfg.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}
