package gpucopy_test

import "github.com/bouncekv/bounce/cuda"

type cudaCtx struct{ c *cuda.Context }
