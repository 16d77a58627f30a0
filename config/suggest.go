package config

import (
	"slices"
	"strings"
)

// DidYouMean returns ` (did you mean "x"?)` for the candidate closest to
// name when it is close enough to be a likely typo (an edit distance of at
// most a third of the name, and at least 1 allowed), or "".
func DidYouMean(name string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range slices.Sorted(slices.Values(candidates)) {
		d := editDistance(strings.ToLower(name), strings.ToLower(c))
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if bestD < 0 || bestD > max(1, len(name)/3) {
		return ""
	}
	return ` (did you mean "` + best + `"?)`
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
