package security

import (
	"errors"
	"fmt"
)

// z85Alphabet is ZeroMQ's Z85 alphabet (RFC 32).
const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// z85Encode encodes b, whose length is a multiple of 4.
func z85Encode(b []byte) string {
	out := make([]byte, 0, len(b)*5/4)
	for i := 0; i+4 <= len(b); i += 4 {
		v := uint32(b[i])<<24 | uint32(b[i+1])<<16 | uint32(b[i+2])<<8 | uint32(b[i+3])
		var chunk [5]byte
		for j := 4; j >= 0; j-- {
			chunk[j] = z85Alphabet[v%85]
			v /= 85
		}
		out = append(out, chunk[:]...)
	}
	return string(out)
}

// z85Decode decodes s, whose length is a multiple of 5.
func z85Decode(s string) ([]byte, error) {
	if len(s)%5 != 0 {
		return nil, fmt.Errorf("z85: length %d is not a multiple of 5", len(s))
	}
	out := make([]byte, 0, len(s)*4/5)
	for i := 0; i < len(s); i += 5 {
		var v uint64
		for j := 0; j < 5; j++ {
			k := z85Index(s[i+j])
			if k < 0 {
				return nil, fmt.Errorf("z85: invalid character %q at %d", s[i+j], i+j)
			}
			v = v*85 + uint64(k)
		}
		if v > 0xffffffff {
			return nil, errors.New("z85: group overflows 32 bits")
		}
		out = append(out, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return out, nil
}

func z85Index(c byte) int {
	for i := 0; i < len(z85Alphabet); i++ {
		if z85Alphabet[i] == c {
			return i
		}
	}
	return -1
}
