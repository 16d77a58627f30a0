package config

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseSizeForms(t *testing.T) {
	cases := map[string]Size{
		"0": 0, "4096": 4096, "18446744073709551615": math.MaxUint64, "  4096  ": 4096,
		"1B": 1, "1b": 1, "7 B": 7,
		"1K": KiB, "1k": KiB, "1KB": KiB, "1kb": KiB, "1Kb": KiB, "1kB": KiB, "1KiB": KiB, "1kib": KiB, "1KIB": KiB, "1kIb": KiB,
		"64 KiB": 64 * KiB, "64\tKiB": 64 * KiB, "64   kb": 64 * KiB,
		"1M": MiB, "1m": MiB, "1MB": MiB, "1mb": MiB, "1MiB": MiB, "1mib": MiB, "1MIB": MiB, "512mb": 512 * MiB, "256MiB": 256 * MiB,
		"1G": GiB, "1g": GiB, "1GB": GiB, "1gb": GiB, "1GiB": GiB, "1gib": GiB, "1GIB": GiB, "4 gB": 4 * GiB,
		"1T": TiB, "1t": TiB, "1TB": TiB, "1tb": TiB, "1TiB": TiB, "1tib": TiB, "16777215TiB": 16777215 * TiB,
		"0MiB": 0, "007k": 7 * KiB,
		"2.5GiB": 5 * GiB / 2, "2.5 gib": 5 * GiB / 2, "0.5KiB": 512, "1.25M": 5 * MiB / 4, "1.0B": 1, "3.000K": 3 * KiB,
	}
	for in, want := range cases {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestParseSizeRejects(t *testing.T) {
	for _, in := range []string{
		"", " ", "MiB", "K", "-1", "+1", "-1K", "1.5B", "0.3K", "1.G", ".5G", "1e3", "1.5.5K", "16777216.5TiB", "0x10", "1_000", "1,000",
		"1 2", "1iB", "1KiBB", "1 K iB", "1Ki", "1kbit", "1P", "1PiB", "1 KiB extra", "one",
		"18446744073709551616", "16777216TiB", "17179869184G", "17592186044416M", "18014398509481984K",
		"1\u212a", // Kelvin sign, which Unicode lower-cases to 'k'
	} {
		got, err := ParseSize(in)
		if err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
			continue
		}
		if !strings.Contains(err.Error(), strconv.Quote(in)) {
			t.Errorf("ParseSize(%q) error %q does not quote the input", in, err)
		}
		if !strings.Contains(err.Error(), "64 bits") && !strings.Contains(err.Error(), "K/KB/KiB") {
			t.Errorf("ParseSize(%q) error %q names neither the limit nor the accepted forms", in, err)
		}
	}
}

func TestSizeString(t *testing.T) {
	cases := map[Size]string{
		0: "0B", 1: "1B", 1000: "1000B", 1023: "1023B", KiB: "1KiB", 1536: "1536B", 1536 * KiB: "1536KiB",
		16 * KiB: "16KiB", MiB: "1MiB", 256 * MiB: "256MiB", 3 * GiB: "3GiB", TiB: "1TiB", 1 << 50: "1024TiB",
		math.MaxUint64: "18446744073709551615B", math.MaxUint64 &^ (TiB - 1): "16777215TiB",
	}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("Size(%d).String() = %q, want %q", uint64(s), got, want)
		}
		back, err := ParseSize(s.String())
		if err != nil || back != s {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s.String(), back, err, uint64(s))
		}
		text, _ := s.MarshalText()
		var u Size
		if err := u.UnmarshalText(text); err != nil || u != s {
			t.Errorf("text round trip of %d: %d, %v", uint64(s), uint64(u), err)
		}
	}
	var u Size = 5
	if err := u.UnmarshalText([]byte("lots")); err == nil || u != 5 {
		t.Fatalf("UnmarshalText(lots) = %v, value %d", err, uint64(u))
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range sizeSeeds() {
		f.Add(s.s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			if v != 0 {
				t.Fatalf("error with value %d", v)
			}
			return
		}
		back, err := ParseSize(v.String())
		if err != nil || back != v {
			t.Fatalf("%q → %d → %q → %d, %v", s, uint64(v), v.String(), uint64(back), err)
		}
		// Units are case-insensitive and a bare number is bytes.
		if up, err := ParseSize(strings.ToUpper(s)); err != nil || up != v {
			t.Fatalf("upper-case %q → %d, %v; lower %d", strings.ToUpper(s), uint64(up), err, uint64(v))
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64); err == nil && Size(n) != v {
			t.Fatalf("bare number %q → %d", s, uint64(v))
		}
	})
}

// sizeSeed is a seed of FuzzParseSize and whether ParseSize must accept it.
type sizeSeed struct {
	s     string
	valid bool
}

func sizeSeeds() []sizeSeed {
	return []sizeSeed{
		{"256MiB", true}, {"512mb", true}, {"1g", true}, {"4096", true}, {"64 KiB", true}, {"1T", true}, {"0", true},
		{"18446744073709551615", true}, {"16777216TiB", false}, {"1.5G", true}, {"-1", false}, {"KiB", false}, {"", false},
		{"2.5GiB", true}, {"1.5B", false}, {".5G", false},
	}
}
