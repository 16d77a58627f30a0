package mem

import "golang.org/x/sys/unix"

func unmap(a *Arena) error { err := unix.Munmap(a.buf); a.buf = nil; return err }
