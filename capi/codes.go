package main

import (
	"errors"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/transfer"
)

// Result codes, as bounce.h numbers them (its BOUNCE_OK and BOUNCE_ERR_*).
const (
	codeOK = iota
	codeInvalid
	codeBadHandle
	codeUnknownPeer
	codeTimeout
	codeClosed
	codePeerLost
	codeOutOfBounds
	codeNotRegistered
	codeInUse
	codeNotQuiescent
	codeDeviceFault
	codeUnsupported
	codeForbidden
	codeBusy
	codeRefused
	codeFailed
	codeIncompatibleLayout
	codeLast = codeIncompatibleLayout
)

// errBadHandle: the handle names no live agent or batch.
var errBadHandle = errors.New("no such handle")

// codes maps sentinels to codes, most specific first: ErrForbidden wraps
// ErrOutOfBounds (and outranks ErrRefused: a pull of memory not registered
// for the puller is both), a refused or unavailable route outranks what it
// wraps, and layouts that cannot be converted (convert.ErrIncompatible)
// outrank the ErrUnsupported they come with.
var codes = []struct {
	err  error
	code int
}{
	{errInvalid, codeInvalid},
	{config.ErrUnknownKey, codeInvalid},
	{config.ErrBadValue, codeInvalid},
	{config.ErrOutOfRange, codeInvalid},
	{errBadHandle, codeBadHandle},
	{transfer.ErrForbidden, codeForbidden},
	{pipeline.ErrRefused, codeRefused},
	{convert.ErrIncompatible, codeIncompatibleLayout},
	{pipeline.ErrBounceUnavailable, codeRefused},
	{transfer.ErrDeviceFault, codeDeviceFault},
	{transfer.ErrNotQuiescent, codeNotQuiescent},
	{transfer.ErrPeerLost, codePeerLost},
	{transfer.ErrUnknownPeer, codeUnknownPeer},
	{transfer.ErrTimeout, codeTimeout},
	{transfer.ErrClosed, codeClosed},
	{transfer.ErrOutOfBounds, codeOutOfBounds},
	{transfer.ErrNotRegistered, codeNotRegistered},
	{transfer.ErrInUse, codeInUse},
	{transfer.ErrUnsupported, codeUnsupported},
	{transfer.ErrBusy, codeBusy},
	{transfer.ErrQueueFull, codeBusy},
	{transfer.ErrBadEndpoint, codeInvalid},
	{transfer.ErrBadMetadata, codeInvalid},
}

// codeOf is err's result code: the first sentinel it wraps, else
// BOUNCE_ERR_FAILED.
func codeOf(err error) int {
	if err == nil {
		return codeOK
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return codeFailed
}
