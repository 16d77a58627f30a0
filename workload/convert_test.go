package workload_test

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// TestConversionVerifies: a preset's source, moved by its planned
// conversion's runs into the destination, verifies; the same with one
// head's bytes of one token swapped with its neighbour's, or in another
// request's pattern, does not, and the error names the element.
func TestConversionVerifies(t *testing.T) {
	for _, p := range workload.Conversions() {
		c, err := workload.LookupConversion(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		c.Tokens = 64
		src, dst := make([]byte, c.PoolBytes(c.Src)), make([]byte, c.PoolBytes(c.Dst))
		if err := c.Fill(src, 3); err != nil {
			t.Fatal(err)
		}
		cv, err := convert.Plan(c.Src, c.Dst, convert.Auto)
		if err != nil {
			t.Fatal(err)
		}
		si, di := c.IDs(3)
		sp, dp := c.Pool(c.Src, transfer.Desc{Kind: transfer.Host}), c.Pool(c.Dst, transfer.Desc{Kind: transfer.Host})
		groups, err := cv.Groups(len(si), len(di))
		if err != nil {
			t.Fatal(err)
		}
		units := groups * uint64(len(sp.Regions))
		staging := make([]byte, units*cv.UnitLen())
		transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: sp, IDs: si}, Count: units}, Shape: cv.Src}.Runs(func(a, o, n uint64) bool {
			copy(staging[o:o+n], src[a:a+n])
			return true
		})
		transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: dp, IDs: di}, Count: units}, Shape: cv.Dst}.Runs(func(a, o, n uint64) bool {
			copy(dst[a:a+n], staging[o:o+n])
			return true
		})
		if err := c.Verify(dst, 3); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if err := c.Verify(dst, 4); err == nil {
			t.Fatalf("%s: another request's pattern verified", p.Name)
		}
		// Swap token 0 and 1 of the first moved head of destination block
		// di[0] in region 1 (layer 0's V).
		l := c.Dst
		h := c.Src.FirstHead
		base := dp.Regions[1] + uint64(di[0])*dp.Stride
		a, b := base+l.Offset(0, h), base+l.Offset(1, h)
		n := l.HeadLen()
		tmp := append([]byte(nil), dst[a:a+n]...)
		copy(dst[a:a+n], dst[b:b+n])
		copy(dst[b:b+n], tmp)
		if err := c.Verify(dst, 3); err == nil || !strings.Contains(err.Error(), "layer 0 V token 0 head") {
			t.Fatalf("%s: swapped tokens: %v", p.Name, err)
		}
	}
}
