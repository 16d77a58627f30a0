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
