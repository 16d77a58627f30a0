// Command oldplugin is a plugin as a binary built against bounce plugin
// protocol version 1 looks to a host: the same go-plugin cookie, version
// 1, an engine kind. The tests check that a host refuses it with a clear
// version message.
package main

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

type v1Engine struct{ plugin.NetRPCUnsupportedPlugin }

func (v1Engine) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return nil }

func (v1Engine) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("server side only")
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "BOUNCE_PLUGIN", MagicCookieValue: "bounce-kv-plugin-v1"},
		Plugins:         plugin.PluginSet{"engine": v1Engine{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
