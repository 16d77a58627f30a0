package wire

import "github.com/bouncekv/bounce/transfer"

// Encoded sizes a sender needs to keep its messages within a control
// channel's limit (see Sizes). They follow the layouts in the package
// documentation.
const (
	// SingleRunSize is the encoded size of a DATA run of one copy with no
	// strides.
	SingleRunSize = singleSize
	// StridedRunSize is the encoded size of any other DATA run.
	StridedRunSize = stridedSize
	// CreditSize is the encoded size of one GRANT credit.
	CreditSize = creditSize
)

// RunSize returns the encoded size of r in a DATA.
func RunSize(r transfer.Run) int {
	if isSingle(&r) {
		return singleSize
	}
	return stridedSize
}

// DataOverhead is the size of a DATA without its runs, for a traceparent of
// traceParentLen bytes.
func DataOverhead(traceParentLen int) int {
	return headerLen + 8 + 4 + 8 + strPrefix + traceParentLen + 4
}

// GrantOverhead is the size of a GRANT without its credits.
const GrantOverhead = headerLen + 8 + 4
