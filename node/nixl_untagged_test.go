//go:build !nixl

package node

const nixlBuilt = false
