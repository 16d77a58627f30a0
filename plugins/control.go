package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Control opens the plugin's control channel for agent name with opts. The
// channel owns the Client: closing it ends the plugin process.
func (c *Client) Control(name string, opts map[string]string) (transfer.ControlChannel, error) {
	rpc, rep, err := open[pb.ControlClient](c, KindControl, "control channel", name, opts)
	if err != nil {
		return nil, err
	}
	return &remoteControl{c: c, rpc: rpc, kind: string(rep.GetName()), endpoint: string(rep.GetEndpoint())}, nil
}

// remoteControl is a transfer.ControlChannel in a plugin process.
type remoteControl struct {
	c              *Client
	rpc            pb.ControlClient
	kind, endpoint string
	wake           recvWake // of Recv
}

// WakeRecv makes a Recv in progress, or else the next one, return at once
// with ErrTimeout (transfer.RecvWaker).
func (r *remoteControl) WakeRecv() { r.wake.wake() }

// Kind returns the plugin channel's kind.
func (r *remoteControl) Kind() string { return r.kind }

// LocalEndpoint returns the plugin channel's endpoint.
func (r *remoteControl) LocalEndpoint() string { return r.endpoint }

func (r *remoteControl) call(what string, f func(context.Context) (*pb.Reply, error)) error {
	return call(r.c, "control channel", what, f)
}

// AddPeer adds or replaces a peer in the plugin channel.
func (r *remoteControl) AddPeer(peer, endpoint string) error {
	return r.call(fmt.Sprintf("add peer %q", peer), func(cx context.Context) (*pb.Reply, error) {
		return r.rpc.AddPeer(cx, &pb.PeerRequest{Peer: []byte(peer), Endpoint: []byte(endpoint)})
	})
}

// RemovePeer removes a peer from the plugin channel.
func (r *remoteControl) RemovePeer(peer string) error {
	return r.call(fmt.Sprintf("remove peer %q", peer), func(cx context.Context) (*pb.Reply, error) {
		return r.rpc.RemovePeer(cx, &pb.PeerRequest{Peer: []byte(peer)})
	})
}

// Send queues a message in the plugin channel (one bounded round trip).
func (r *remoteControl) Send(peer string, payload []byte) error {
	return r.call(fmt.Sprintf("send to %q", peer), func(cx context.Context) (*pb.Reply, error) {
		return r.rpc.Send(cx, &pb.MessageRequest{Peer: []byte(peer), Payload: payload})
	})
}

// Recv waits at most timeout in the plugin.
func (r *remoteControl) Recv(timeout time.Duration) (transfer.Message, error) {
	return recvMessage(r.c, &r.wake, "receive", timeout, func(cx context.Context, req *pb.RecvRequest) (*pb.MessageReply, error) {
		return r.rpc.Recv(cx, req)
	})
}

// Close closes the plugin channel and ends the plugin process. It is
// idempotent.
func (r *remoteControl) Close() error { return closeRemote(r.c, "control channel", r.rpc.Close) }

// controlServer is the plugin side of the Control service.
type controlServer struct {
	pb.UnimplementedControlServer
	open func(name string, opts map[string]string) (transfer.ControlChannel, error)

	mu     sync.Mutex
	ch     transfer.ControlChannel
	closed bool
}

func (s *controlServer) channel() (transfer.ControlChannel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil || s.closed {
		return nil, fmt.Errorf("plugin: control channel not open: %w", transfer.ErrClosed)
	}
	return s.ch, nil
}

func (s *controlServer) Open(_ context.Context, r *pb.OpenRequest) (*pb.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil || s.closed {
		return &pb.OpenReply{Error: toProtoError(errors.New("plugin: this process already opened its control channel"))}, nil
	}
	ch, err := s.open(string(r.GetName()), r.GetOptions())
	if err != nil {
		return &pb.OpenReply{Error: toProtoError(err)}, nil
	}
	s.ch = ch
	return &pb.OpenReply{Name: []byte(ch.Kind()), Endpoint: []byte(ch.LocalEndpoint())}, nil
}

func (s *controlServer) AddPeer(_ context.Context, r *pb.PeerRequest) (*pb.Reply, error) {
	ch, err := s.channel()
	if err != nil {
		return reply(err), nil
	}
	return reply(ch.AddPeer(string(r.GetPeer()), string(r.GetEndpoint()))), nil
}

func (s *controlServer) RemovePeer(_ context.Context, r *pb.PeerRequest) (*pb.Reply, error) {
	ch, err := s.channel()
	if err != nil {
		return reply(err), nil
	}
	return reply(ch.RemovePeer(string(r.GetPeer()))), nil
}

func (s *controlServer) Send(_ context.Context, r *pb.MessageRequest) (*pb.Reply, error) {
	ch, err := s.channel()
	if err != nil {
		return reply(err), nil
	}
	return reply(ch.Send(string(r.GetPeer()), r.GetPayload())), nil
}

func (s *controlServer) Recv(_ context.Context, r *pb.RecvRequest) (*pb.MessageReply, error) {
	ch, err := s.channel()
	if err != nil {
		return &pb.MessageReply{Error: toProtoError(err)}, nil
	}
	m, err := ch.Recv(time.Duration(r.GetTimeoutNs()))
	return &pb.MessageReply{Peer: []byte(m.Peer), Payload: m.Payload, From: []byte(m.From), Error: toProtoError(err)}, nil
}

func (s *controlServer) Close(context.Context, *pb.Empty) (*pb.Reply, error) {
	s.mu.Lock()
	ch, closed := s.ch, s.closed
	s.closed = true
	s.mu.Unlock()
	if ch == nil || closed {
		return &pb.Reply{}, nil
	}
	return reply(ch.Close()), nil
}
