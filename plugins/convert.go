package plugins

import (
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Thin shims between transfer types and their wire form.

func toProtoDesc(d transfer.Desc) *pb.Desc {
	return &pb.Desc{Addr: d.Addr, Len: d.Len, Device: d.Device, Kind: uint32(d.Kind)}
}

func fromProtoDesc(d *pb.Desc) transfer.Desc {
	return transfer.Desc{Addr: d.GetAddr(), Len: d.GetLen(), Device: d.GetDevice(), Kind: transfer.MemKind(d.GetKind())}
}

func toProtoWrites(ops []transfer.WriteOp) []*pb.WriteOp {
	out := make([]*pb.WriteOp, len(ops))
	for i, o := range ops {
		out[i] = &pb.WriteOp{Src: toProtoDesc(o.Src), Dst: toProtoDesc(o.Dst)}
	}
	return out
}

func fromProtoWrites(ops []*pb.WriteOp) []transfer.WriteOp {
	out := make([]transfer.WriteOp, len(ops))
	for i, o := range ops {
		out[i] = transfer.WriteOp{Src: fromProtoDesc(o.GetSrc()), Dst: fromProtoDesc(o.GetDst())}
	}
	return out
}

func toProtoRuns(runs []transfer.Run) []*pb.Run {
	out := make([]*pb.Run, len(runs))
	for i, r := range runs {
		out[i] = &pb.Run{RegionOff: r.RegionOff, Addr: r.Addr, Len: r.Len, Count: r.Count, RegionStride: r.RegionStride, AddrStride: r.AddrStride}
	}
	return out
}

func fromProtoRuns(runs []*pb.Run) []transfer.Run {
	out := make([]transfer.Run, len(runs))
	for i, r := range runs {
		out[i] = transfer.Run{RegionOff: r.GetRegionOff(), Addr: r.GetAddr(), Len: r.GetLen(), Count: r.GetCount(), RegionStride: r.GetRegionStride(), AddrStride: r.GetAddrStride()}
	}
	return out
}
