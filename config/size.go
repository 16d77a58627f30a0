package config

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Size is a byte count. In text it is a number with an optional unit: B,
// K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB, in any case and optionally
// separated by spaces. Every unit is a power of two: 1K = 1KB = 1KiB = 1024.
// A decimal fraction is accepted when it names a whole number of bytes
// (2.5GiB, 0.5KiB; not 1.5B).
type Size uint64

// Byte units.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

// sizeForms describes the accepted text forms, for error messages.
const sizeForms = "a number of bytes with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB (any case, powers of two; a decimal fraction when it makes whole bytes), e.g. 256MiB, 512mb, 1g, 2.5GiB, 64 KiB or 4096"

// ParseSize parses a byte size such as "256MiB", "512mb", "1g", "2.5GiB",
// "64 KiB" or "4096". Signs, exponents, fractions of a byte and overflowing
// values are errors.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && '0' <= t[i] && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want %s", s, sizeForms)
	}
	whole, frac := t[:i], ""
	if i < len(t) && t[i] == '.' {
		j := i + 1
		for j < len(t) && '0' <= t[j] && t[j] <= '9' {
			j++
		}
		if j == i+1 {
			return 0, fmt.Errorf("size %q: want %s", s, sizeForms)
		}
		frac, i = t[i+1:j], j
	}
	var mult Size
	switch asciiLower(strings.TrimSpace(t[i:])) {
	case "", "b":
		mult = 1
	case "k", "kb", "kib":
		mult = KiB
	case "m", "mb", "mib":
		mult = MiB
	case "g", "gb", "gib":
		mult = GiB
	case "t", "tb", "tib":
		mult = TiB
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q: want %s", s, strings.TrimSpace(t[i:]), sizeForms)
	}
	if frac != "" {
		return parseFraction(s, whole, frac, mult)
	}
	n, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || n > math.MaxUint64/uint64(mult) {
		return 0, fmt.Errorf("size %q: does not fit in 64 bits", s)
	}
	return Size(n) * mult, nil
}

// parseFraction computes whole.frac × mult exactly; it must be a whole
// number of bytes that fits in 64 bits.
func parseFraction(s, whole, frac string, mult Size) (Size, error) {
	num, ok := new(big.Int).SetString(whole+frac, 10)
	if !ok {
		return 0, fmt.Errorf("size %q: want %s", s, sizeForms)
	}
	num.Mul(num, new(big.Int).SetUint64(uint64(mult)))
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() != 0 {
		return 0, fmt.Errorf("size %q: is not a whole number of bytes: want %s", s, sizeForms)
	}
	if !q.IsUint64() {
		return 0, fmt.Errorf("size %q: does not fit in 64 bits", s)
	}
	return Size(q.Uint64()), nil
}

// String formats s in the largest unit that divides it exactly: "256MiB",
// "1536KiB", "1000B". ParseSize reads it back.
func (s Size) String() string {
	for _, u := range []struct {
		size Size
		name string
	}{{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if s != 0 && s%u.size == 0 {
			return strconv.FormatUint(uint64(s/u.size), 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(s), 10) + "B"
}

// MarshalText implements encoding.TextMarshaler with String's format.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseSize.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// asciiLower lower-cases ASCII letters only, so that look-alike runes (the
// Kelvin sign lower-cases to 'k') never pass for a unit.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// isPow2 reports whether s is a positive power of two.
func (s Size) isPow2() bool { return s != 0 && s&(s-1) == 0 }
